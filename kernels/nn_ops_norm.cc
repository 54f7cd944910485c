// Dispatch of layernorm and rmsnorm, forward and backward (kernels/nn_ops.h).
#include "kernels/checks.h"
#include "kernels/cpu/norm.h"
#include "kernels/nn_ops.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/nn_kernels.h"
#endif

namespace fsdp::ops {
namespace {

using namespace detail;

// x (..., C) contiguous, floating; weight (C) and bias (C, optional) of the compute dtype:
// x's, or bf16 beside an f32 x (an f32 residual stream, CUDA only); the statistics (rows) of
// the statistics dtype. Returns the problem size.
kernels::NormDims check_norm(Context& ctx, const Tensor& x, const Tensor& weight,
                             const Tensor& bias, std::initializer_list<const Tensor*> stats,
                             const char* what) {
  check_on_ctx(ctx, x, what);
  check_floating(x, what);
  check_contiguous(x, what);
  FSDP_CHECK(x.dim() >= 1, ShapeError, what, ": x must have a channel dimension, got ", x.str());
  kernels::NormDims d;
  d.channels = x.size(-1);
  d.rows = d.channels ? x.numel() / d.channels : 0;
  d.x_dtype = x.dtype();
  d.dtype = weight.defined() ? weight.dtype() : x.dtype();
  const bool wide_x = d.x_dtype == DType::f32 && d.dtype == DType::bf16 && !ctx.device().is_cpu();
  FSDP_CHECK(d.x_dtype == d.dtype || wide_x, DTypeError, what, ": x ", x.str(),
             " with a weight of ", dtype_name(d.dtype), " (x must have the weight's dtype, or "
             "be f32 beside bf16 weights on CUDA)");
  check_dense(ctx, weight, Shape{d.channels}, d.dtype, what);
  if (bias.defined()) check_dense(ctx, bias, Shape{d.channels}, d.dtype, what);
  for (const Tensor* s : stats) {
    check_on_ctx(ctx, *s, what);
    check_dtype(*s, stats_dtype(d.dtype), what);
    check_contiguous(*s, what);
    FSDP_CHECK(s->numel() == d.rows, ShapeError, what, ": statistics ", s->str(), " need ", d.rows,
               " elements (one per row)");
  }
  return d;
}

// An activation tensor shaped like x: in the compute dtype (out, dout), or x's own (dx).
void check_like_x(Context& ctx, const Tensor& t, const Tensor& x, DType dtype, const char* what) {
  check_dense(ctx, t, x.shape(), dtype, what);
}

// dweight and dbias: (C), floating, one grad dtype. Sets d.grad_dtype.
void check_param_grads(Context& ctx, kernels::NormDims& d, std::initializer_list<const Tensor*> grads,
                       const char* what) {
  bool first = true;
  for (const Tensor* g : grads) {
    if (!g->defined()) continue;
    check_on_ctx(ctx, *g, what);
    check_floating(*g, what);
    check_contiguous(*g, what);
    check_shape(*g, Shape{d.channels}, what);
    if (first) d.grad_dtype = g->dtype();
    check_dtype(*g, d.grad_dtype, what);
    first = false;
  }
}

[[maybe_unused]] float* f32_ptr(const Tensor& t) { return static_cast<float*>(t.data_ptr()); }

}  // namespace

void layernorm_forward(Context& ctx, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                       const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const char* what = "layernorm_forward";
  const kernels::NormDims d = check_norm(ctx, x, weight, bias, {&mean, &rstd}, what);
  check_like_x(ctx, out, x, d.dtype, what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::layernorm_forward(d, out.data_ptr(), mean.data_ptr(), rstd.data_ptr(),
                                    x.data_ptr(), weight.data_ptr(), data_or_null(bias), eps);
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::layernorm_forward(d, out.data_ptr(), f32_ptr(mean), f32_ptr(rstd), x.data_ptr(),
                                   weight.data_ptr(), data_or_null(bias), eps,
                                   ctx.stream().cuda_stream());
#endif
}

void layernorm_backward(Context& ctx, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                        const Tensor& dout, const Tensor& x, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, bool accumulate_dx,
                        bool accumulate) {
  const char* what = "layernorm_backward";
  kernels::NormDims d = check_norm(ctx, x, weight, Tensor(), {&mean, &rstd}, what);
  check_like_x(ctx, dout, x, d.dtype, what);
  if (dx.defined()) check_like_x(ctx, dx, x, x.dtype(), what);
  check_param_grads(ctx, d, {&dweight, &dbias}, what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::layernorm_backward(d, data_or_null(dx), data_or_null(dweight), data_or_null(dbias),
                                     dout.data_ptr(), x.data_ptr(), weight.data_ptr(),
                                     mean.data_ptr(), rstd.data_ptr(), accumulate_dx, accumulate);
    return;
  }
#if FSDP_WITH_CUDA
  Tensor workspace = ctx.empty(Shape{int64_t(kernels::cuda::norm_workspace_bytes(d))}, DType::u8);
  kernels::cuda::layernorm_backward(d, data_or_null(dx), data_or_null(dweight), data_or_null(dbias),
                                    dout.data_ptr(), x.data_ptr(), weight.data_ptr(),
                                    f32_ptr(mean), f32_ptr(rstd), accumulate_dx, accumulate,
                                    workspace.data_ptr(), ctx.stream().cuda_stream());
#endif
}

void rmsnorm_forward(Context& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x,
                     const Tensor& weight, double eps) {
  const char* what = "rmsnorm_forward";
  const kernels::NormDims d = check_norm(ctx, x, weight, Tensor(), {&rstd}, what);
  check_like_x(ctx, out, x, d.dtype, what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::rmsnorm_forward(d, out.data_ptr(), rstd.data_ptr(), x.data_ptr(),
                                  weight.data_ptr(), eps);
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::rmsnorm_forward(d, out.data_ptr(), f32_ptr(rstd), x.data_ptr(), weight.data_ptr(),
                                 eps, ctx.stream().cuda_stream());
#endif
}

void rmsnorm_backward(Context& ctx, const Tensor& dx, const Tensor& dweight, const Tensor& dout,
                      const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      bool accumulate_dx, bool accumulate) {
  const char* what = "rmsnorm_backward";
  kernels::NormDims d = check_norm(ctx, x, weight, Tensor(), {&rstd}, what);
  check_like_x(ctx, dout, x, d.dtype, what);
  if (dx.defined()) check_like_x(ctx, dx, x, x.dtype(), what);
  check_param_grads(ctx, d, {&dweight}, what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::rmsnorm_backward(d, data_or_null(dx), data_or_null(dweight), dout.data_ptr(),
                                   x.data_ptr(), weight.data_ptr(), rstd.data_ptr(), accumulate_dx,
                                   accumulate);
    return;
  }
#if FSDP_WITH_CUDA
  Tensor workspace = ctx.empty(Shape{int64_t(kernels::cuda::norm_workspace_bytes(d))}, DType::u8);
  kernels::cuda::rmsnorm_backward(d, data_or_null(dx), data_or_null(dweight), dout.data_ptr(),
                                  x.data_ptr(), weight.data_ptr(), f32_ptr(rstd), accumulate_dx,
                                  accumulate, workspace.data_ptr(), ctx.stream().cuda_stream());
#endif
}

}  // namespace fsdp::ops
