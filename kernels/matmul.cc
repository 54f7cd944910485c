// Dispatch of matmul, batched_matmul and bias_backward (kernels/matmul.h).
#include "kernels/matmul.h"

#include <functional>

#include "kernels/checks.h"
#include "kernels/cpu/matmul.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/column_sum.h"
#include "kernels/cuda/matmul.h"
#endif

namespace fsdp::ops {
namespace {

using namespace detail;

// The problem size of out = op(a) @ op(b) over the last two dimensions of a, b and out.
kernels::MatmulDims matmul_dims(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a,
                                bool trans_b, const char* what) {
  const int64_t r = a.dim();
  kernels::MatmulDims d;
  d.trans_a = trans_a;
  d.trans_b = trans_b;
  d.m = trans_a ? a.size(r - 1) : a.size(r - 2);
  d.k = trans_a ? a.size(r - 2) : a.size(r - 1);
  const int64_t kb = trans_b ? b.size(r - 1) : b.size(r - 2);
  d.n = trans_b ? b.size(r - 2) : b.size(r - 1);
  FSDP_CHECK(d.k == kb, ShapeError, what, ": inner dimensions differ, op(a) is (", d.m, ", ", d.k,
             ") and op(b) is (", kb, ", ", d.n, ") for a ", a.str(), ", b ", b.str(),
             trans_a ? " (a transposed)" : "", trans_b ? " (b transposed)" : "");
  FSDP_CHECK(out.size(r - 2) == d.m && out.size(r - 1) == d.n, ShapeError, what, ": output ",
             out.str(), " should be (", d.m, ", ", d.n, ")");
  return d;
}

void check_operands(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b, int64_t rank,
                    const char* what) {
  for (const Tensor* t : {&out, &a, &b}) {
    check_on_ctx(ctx, *t, what);
    check_floating(*t, what);
    check_contiguous(*t, what);
    FSDP_CHECK(t->dim() == rank, ShapeError, what, ": expected ", rank, "-D tensors, got ", t->str());
  }
  check_same_dtype(a, b, what);
  FSDP_CHECK(out.dtype() == a.dtype() || out.dtype() == DType::f32 || out.dtype() == DType::f64,
             DTypeError, what, ": output ", out.str(), " for ", dtype_name(a.dtype()),
             " inputs must have their dtype or be f32/f64");
}

}  // namespace

void matmul(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a,
            bool trans_b, double alpha, double beta, const Tensor& bias, Epilogue epilogue,
            const Tensor& aux) {
  const char* what = "matmul";
  check_operands(ctx, out, a, b, 2, what);
  const kernels::MatmulDims d = matmul_dims(out, a, b, trans_a, trans_b, what);
  if (bias.defined()) check_dense(ctx, bias, Shape{d.n}, out.dtype(), "matmul bias");
  FSDP_CHECK(epilogue != Epilogue::BiasGrad, ValueError,
             "matmul: bias gradients come from ops::matmul_bias_grad, not Epilogue::BiasGrad");
  const bool gelu = epilogue == Epilogue::Gelu, dgelu = epilogue == Epilogue::DGelu;
  if (aux.defined()) {
    FSDP_CHECK(gelu || dgelu, ValueError, "matmul: aux is only used by Epilogue::Gelu / DGelu");
    check_dense(ctx, aux, Shape{d.m, d.n}, out.dtype(), "matmul aux");
  }
  FSDP_CHECK(!dgelu || aux.defined(), ValueError, "matmul: Epilogue::DGelu reads the GELU input from aux");
  FSDP_CHECK(!dgelu || !bias.defined(), ValueError, "matmul: Epilogue::DGelu takes no bias");
  FSDP_CHECK(epilogue == Epilogue::None || beta == 0.0, ValueError,
             "matmul: a GELU epilogue needs beta = 0, got ", beta);
  if (ctx.device().is_cpu()) {
    kernels::cpu::matmul(d, out.data_ptr(), out.dtype(), a.data_ptr(), b.data_ptr(), a.dtype(),
                         alpha, beta, data_or_null(bias), data_or_null(aux), epilogue);
    return;
  }
#if FSDP_WITH_CUDA
  ctx.extension<kernels::cuda::Blas>().matmul(d, out.data_ptr(), out.dtype(), a.data_ptr(),
                                              b.data_ptr(), a.dtype(), alpha, beta,
                                              data_or_null(bias), data_or_null(aux), epilogue);
#endif
}

void batched_matmul(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b,
                    bool trans_a, bool trans_b, double alpha, double beta) {
  const char* what = "batched_matmul";
  check_operands(ctx, out, a, b, 3, what);
  kernels::MatmulDims d = matmul_dims(out, a, b, trans_a, trans_b, what);
  FSDP_CHECK(a.size(0) == b.size(0) && a.size(0) == out.size(0), ShapeError, what,
             ": batch sizes differ: ", a.str(), ", ", b.str(), ", ", out.str());
  d.batch = a.size(0);
  d.batch_stride_a = d.m * d.k;
  d.batch_stride_b = d.k * d.n;
  d.batch_stride_out = d.m * d.n;
  if (ctx.device().is_cpu()) {
    kernels::cpu::matmul(d, out.data_ptr(), out.dtype(), a.data_ptr(), b.data_ptr(), a.dtype(),
                         alpha, beta, nullptr, nullptr, kernels::MatmulEpilogue::None);
    return;
  }
#if FSDP_WITH_CUDA
  ctx.extension<kernels::cuda::Blas>().matmul(d, out.data_ptr(), out.dtype(), a.data_ptr(),
                                              b.data_ptr(), a.dtype(), alpha, beta, nullptr,
                                              nullptr, kernels::MatmulEpilogue::None);
#endif
}

void matmul_bias_grad(Context& ctx, const Tensor& dw, const Tensor& a, const Tensor& b,
                      bool trans_a, bool trans_b, double alpha, double beta, const Tensor& dbias,
                      bool accumulate_dbias) {
  const char* what = "matmul_bias_grad";
  check_operands(ctx, dw, a, b, 2, what);
  const kernels::MatmulDims d = matmul_dims(dw, a, b, trans_a, trans_b, what);
  check_on_ctx(ctx, dbias, what);
  check_floating(dbias, what);
  check_contiguous(dbias, what);
  check_shape(dbias, Shape{d.m}, what);
  FSDP_CHECK(trans_a && alpha == 1.0, ValueError, what,
             ": the bias gradient is the column sums of a = dy (K, M): trans_a and alpha 1");
#if FSDP_WITH_CUDA
  // cuBLASLt's BGRADB epilogue where it has one for the problem (its scratch is given back
  // before the fallback below runs).
  if (ctx.device().is_cuda()) {
    ScratchTensors scratch(ctx);
    if (kernels::cuda::matmul_bias_grad(ctx.extension<kernels::cuda::Blas>(), d, dw.data_ptr(),
                                        dw.dtype(), a.data_ptr(), b.data_ptr(), a.dtype(), alpha,
                                        beta, dbias.data_ptr(), dbias.dtype(), accumulate_dbias,
                                        std::ref(scratch), ctx.stream().cuda_stream()))
      return;
  }
#endif
  matmul(ctx, dw, a, b, trans_a, trans_b, alpha, beta);
  // a (K, M) holds dy: its column sums are the bias gradient.
  bias_backward(ctx, dbias, a, accumulate_dbias);
}

void bias_backward(Context& ctx, const Tensor& dbias, const Tensor& dout, bool accumulate) {
  const char* what = "bias_backward";
  check_on_ctx(ctx, dout, what);
  check_floating(dout, what);
  check_contiguous(dout, what);
  FSDP_CHECK(dout.dim() >= 1, ShapeError, what, ": dout must have a last dimension, got ", dout.str());
  const int64_t n = dout.size(-1), m = n ? dout.numel() / n : 0;
  check_on_ctx(ctx, dbias, what);
  check_floating(dbias, what);
  check_contiguous(dbias, what);
  check_shape(dbias, Shape{n}, what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::bias_backward(dbias.data_ptr(), dbias.dtype(), dout.data_ptr(), dout.dtype(), m,
                                n, accumulate);
    return;
  }
#if FSDP_WITH_CUDA
  Tensor workspace =
      ctx.empty(Shape{int64_t(kernels::cuda::column_sum_workspace_bytes(m, n))}, DType::u8);
  kernels::cuda::bias_backward(dbias.data_ptr(), dbias.dtype(), dout.data_ptr(), dout.dtype(), m,
                               n, accumulate, workspace.data_ptr(), ctx.stream().cuda_stream());
#endif
}

}  // namespace fsdp::ops
