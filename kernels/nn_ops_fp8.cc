// Dispatch of the FP8 ops: fp8_scales, fp8_quantize, fp8_matmul (kernels/nn_ops.h).
#include "kernels/checks.h"
#include "kernels/cpu/fp8.h"
#include "kernels/fp8_math.h"
#include "kernels/nn_ops.h"
#include "kernels/ops.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/matmul.h"
#endif

namespace fsdp::ops {
namespace {

using namespace detail;

void check_scales(const Context& ctx, const Tensor& scales, const char* what) {
  check_dense(ctx, scales, Shape{kernels::kFp8Scales}, DType::f32, what);
}

void check_fp8_operand(const Context& ctx, const Tensor& t, const char* what) {
  check_on_ctx(ctx, t, what);
  check_contiguous(t, what);
  FSDP_CHECK(is_fp8(t.dtype()) && t.dim() == 2, DTypeError, what,
             ": a 2-D FP8 (f8e4m3, f8e5m2) operand expected, got ", t.str());
}

const float* scale_at(const Tensor& scales, int offset) {
  return static_cast<const float*>(scales.data_ptr()) + offset;
}
float* scale_at_mut(const Tensor& scales, int offset) {
  return static_cast<float*>(scales.data_ptr()) + offset;
}

}  // namespace

void fp8_scales(Context& ctx, const Tensor& scales, const Tensor& x, DType fp8) {
  const char* what = "fp8_scales";
  check_scales(ctx, scales, what);
  check_on_ctx(ctx, x, what);
  check_floating(x, what);
  check_contiguous(x, what);
  const float max = fp8_max(fp8);  // throws for a non-FP8 dtype
  float* amax = scale_at_mut(scales, kernels::kFp8Amax);
  float* scale = scale_at_mut(scales, kernels::kFp8Scale);
  float* scale_inv = scale_at_mut(scales, kernels::kFp8ScaleInv);
  if (ctx.device().is_cpu()) {
    kernels::cpu::fp8_amax(x.data_ptr(), x.dtype(), x.numel(), amax);
    kernels::cpu::fp8_compute_scale(amax, max, scale, scale_inv);
    return;
  }
#if FSDP_WITH_CUDA
  CUstream_st* stream = ctx.stream().cuda_stream();
  kernels::cuda::fp8_amax(x.data_ptr(), x.dtype(), x.numel(), amax, stream);
  kernels::cuda::fp8_compute_scale(amax, max, scale, scale_inv, stream);
#endif
}

void fp8_quantize(Context& ctx, const Tensor& out, const Tensor& out_t, const Tensor& x,
                  const Tensor& scales) {
  const char* what = "fp8_quantize";
  check_on_ctx(ctx, x, what);
  check_floating(x, what);
  check_contiguous(x, what);
  FSDP_CHECK(x.dim() == 2, ShapeError, what, ": x must be (R, C), got ", x.str());
  check_scales(ctx, scales, what);
  FSDP_CHECK(out.defined() || out_t.defined(), ValueError, what, ": no output given");
  const int64_t rows = x.size(0), cols = x.size(1);
  const DType fp8 = out.defined() ? out.dtype() : out_t.dtype();
  FSDP_CHECK(is_fp8(fp8), DTypeError, what, ": FP8 outputs expected, got ",
             out.defined() ? out.str() : out_t.str());
  if (out.defined()) check_dense(ctx, out, Shape{rows, cols}, fp8, what);
  if (out_t.defined()) check_dense(ctx, out_t, Shape{cols, rows}, fp8, what);
  const float* scale = scale_at(scales, kernels::kFp8Scale);
  if (ctx.device().is_cpu()) {
    kernels::cpu::fp8_quantize(x.data_ptr(), x.dtype(), rows, cols, scale, data_or_null(out),
                               data_or_null(out_t), fp8);
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::fp8_quantize(x.data_ptr(), x.dtype(), rows, cols, scale, data_or_null(out),
                              data_or_null(out_t), fp8, ctx.stream().cuda_stream());
#endif
}

void fp8_matmul(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& a_scales,
                const Tensor& b, const Tensor& b_scales, double beta, const Tensor& bias,
                Epilogue epilogue, const Tensor& aux) {
  const char* what = "fp8_matmul";
  check_fp8_operand(ctx, a, what);
  check_fp8_operand(ctx, b, what);
  check_scales(ctx, a_scales, what);
  check_scales(ctx, b_scales, what);
  FSDP_CHECK(!(a.dtype() == DType::f8e5m2 && b.dtype() == DType::f8e5m2), DTypeError, what,
             ": at most one operand may be f8e5m2, got ", a.str(), " and ", b.str());
  kernels::MatmulDims d;
  d.m = a.size(0);
  d.k = a.size(1);
  d.n = b.size(0);
  d.trans_b = true;
  FSDP_CHECK(b.size(1) == d.k, ShapeError, what, ": a ", a.str(), " and b ", b.str(),
             " must share their last dimension K");
  FSDP_CHECK(d.m % 16 == 0 && d.n % 16 == 0 && d.k % 16 == 0 && d.k > 0, ShapeError, what,
             ": M, N, K must be positive multiples of 16 (FP8 tensor cores), got a ", a.str(),
             ", b ", b.str());
  check_on_ctx(ctx, out, what);
  check_contiguous(out, what);
  check_shape(out, Shape{d.m, d.n}, what);
  const bool cpu = ctx.device().is_cpu();
  const DType od = out.dtype();
  FSDP_CHECK(cpu ? (od == DType::f32 || od == DType::f64) : (od == DType::bf16 || od == DType::f32),
             DTypeError, what, ": output ", out.str(), " must be ",
             cpu ? "f32 or f64 on the CPU" : "bf16 or f32 on CUDA");
  FSDP_CHECK(epilogue == Epilogue::None || epilogue == Epilogue::Gelu, ValueError, what,
             ": epilogue None or Gelu only");
  FSDP_CHECK(epilogue == Epilogue::None || beta == 0.0, ValueError, what,
             ": a GELU epilogue needs beta = 0, got ", beta);
  if (bias.defined()) check_dense(ctx, bias, Shape{d.n}, od, "fp8_matmul bias");
  if (aux.defined()) {
    FSDP_CHECK(epilogue == Epilogue::Gelu, ValueError, what,
               ": aux is only used by Epilogue::Gelu");
    check_dense(ctx, aux, Shape{d.m, d.n}, od, "fp8_matmul aux");
  }
  const float* sa = scale_at(a_scales, kernels::kFp8ScaleInv);
  const float* sb = scale_at(b_scales, kernels::kFp8ScaleInv);
  if (cpu) {
    kernels::cpu::fp8_matmul(d, out.data_ptr(), od, a.data_ptr(), a.dtype(), sa, b.data_ptr(),
                             b.dtype(), sb, 1.0, beta, data_or_null(bias), data_or_null(aux),
                             epilogue);
    return;
  }
#if FSDP_WITH_CUDA
  auto& blas = ctx.extension<kernels::cuda::Blas>();
  if (blas.fp8_matmul(d, out.data_ptr(), od, a.data_ptr(), a.dtype(), sa, b.data_ptr(),
                      b.dtype(), sb, 1.0, beta, data_or_null(bias), data_or_null(aux), epilogue))
    return;
  // No FP8 algorithm with the bias or GELU: the plain product into the pre-activation's
  // buffer, then our bias add (the bias broadcast over the rows as a zero-stride view) and
  // GELU.
  const bool gelu = epilogue == Epilogue::Gelu;
  const Tensor pre = !gelu ? out : aux.defined() ? aux : ctx.empty(Shape{d.m, d.n}, od);
  blas.fp8_matmul(d, pre.data_ptr(), od, a.data_ptr(), a.dtype(), sa, b.data_ptr(), b.dtype(),
                  sb, 1.0, beta, nullptr, nullptr, Epilogue::None);
  if (bias.defined())
    add(ctx, pre, pre, bias.as_strided(Shape{d.m, d.n}, Strides{0, 1}, bias.offset()));
  if (gelu) gelu_forward(ctx, out, pre);
#endif
}

}  // namespace fsdp::ops
