// Dispatch of gelu and swiglu, forward and backward (kernels/activation.h).
#include "kernels/activation.h"

#include "kernels/checks.h"
#include "kernels/cpu/activation.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/activation.h"
#endif

namespace fsdp::ops {
namespace {

using namespace detail;

void check_activation(Context& ctx, const Tensor& t, const char* what) {
  check_on_ctx(ctx, t, what);
  check_floating(t, what);
  check_contiguous(t, what);
}

// x (..., 2F) and out (..., F) of one dtype; returns (rows, F).
std::pair<int64_t, int64_t> swiglu_dims(Context& ctx, const Tensor& half, const Tensor& x,
                                        const char* what) {
  check_activation(ctx, half, what);
  check_activation(ctx, x, what);
  check_same_dtype(half, x, what);
  FSDP_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, ShapeError, what,
             ": x must end in an even dimension 2F ([gate | up]), got ", x.str());
  const int64_t f = x.size(-1) / 2;
  std::vector<int64_t> dims = x.shape().dims();
  dims.back() = f;
  check_shape(half, Shape(dims), what);
  return {f ? half.numel() / f : 0, f};
}

}  // namespace

void gelu_forward(Context& ctx, const Tensor& out, const Tensor& x) {
  const char* what = "gelu_forward";
  check_activation(ctx, x, what);
  check_dense(ctx, out, x.shape(), x.dtype(), what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::gelu_forward(out.data_ptr(), x.data_ptr(), x.numel(), x.dtype());
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::gelu_forward(out.data_ptr(), x.data_ptr(), x.numel(), x.dtype(),
                              ctx.stream().cuda_stream());
#endif
}

void gelu_backward(Context& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x) {
  const char* what = "gelu_backward";
  check_activation(ctx, x, what);
  check_dense(ctx, dout, x.shape(), x.dtype(), what);
  check_dense(ctx, dx, x.shape(), x.dtype(), what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::gelu_backward(dx.data_ptr(), dout.data_ptr(), x.data_ptr(), x.numel(), x.dtype());
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::gelu_backward(dx.data_ptr(), dout.data_ptr(), x.data_ptr(), x.numel(), x.dtype(),
                               ctx.stream().cuda_stream());
#endif
}

void swiglu_forward(Context& ctx, const Tensor& out, const Tensor& x) {
  const auto [rows, f] = swiglu_dims(ctx, out, x, "swiglu_forward");
  if (ctx.device().is_cpu()) {
    kernels::cpu::swiglu_forward(out.data_ptr(), x.data_ptr(), rows, f, x.dtype());
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::swiglu_forward(out.data_ptr(), x.data_ptr(), rows, f, x.dtype(),
                                ctx.stream().cuda_stream());
#endif
}

void swiglu_backward(Context& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x) {
  const char* what = "swiglu_backward";
  const auto [rows, f] = swiglu_dims(ctx, dout, x, what);
  check_dense(ctx, dx, x.shape(), x.dtype(), what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::swiglu_backward(dx.data_ptr(), dout.data_ptr(), x.data_ptr(), rows, f, x.dtype());
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::swiglu_backward(dx.data_ptr(), dout.data_ptr(), x.data_ptr(), rows, f, x.dtype(),
                                 ctx.stream().cuda_stream());
#endif
}

}  // namespace fsdp::ops
