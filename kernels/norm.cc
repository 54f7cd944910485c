// Dispatch of layernorm and rmsnorm, forward and backward (kernels/norm.h).
#include "kernels/norm.h"

#include "kernels/checks.h"
#include "kernels/cpu/norm.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/norm.h"
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

// sum and residual of a fused residual add: sum like x (x's dtype), residual like out.
void check_residual(Context& ctx, const kernels::NormDims& d, const Tensor& sum,
                    const Tensor& residual, const Tensor& x, const char* what) {
  check_dense(ctx, sum, x.shape(), d.x_dtype, what);
  check_dense(ctx, residual, x.shape(), d.dtype, what);
  FSDP_CHECK(sum.data_ptr() != residual.data_ptr(), ValueError, what,
             ": sum must not overwrite the residual");
}

// dx_addend: a gradient of x's dtype and shape added into dx (accumulate_dx must be off).
const void* addend_or_dx(Context& ctx, const Tensor& dx, const Tensor& dx_addend, const Tensor& x,
                         bool accumulate_dx, const char* what) {
  if (!dx_addend.defined()) return accumulate_dx ? dx.data_ptr() : nullptr;
  FSDP_CHECK(dx.defined() && !accumulate_dx, ValueError, what,
             ": dx_addend needs a dx to write and accumulate_dx off");
  check_like_x(ctx, dx_addend, x, x.dtype(), what);
  return dx_addend.data_ptr();
}

void layernorm_forward_impl(Context& ctx, const Tensor& sum, const Tensor& out,
                            const Tensor& mean, const Tensor& rstd, const Tensor& x,
                            const Tensor& residual, const Tensor& weight, const Tensor& bias,
                            double eps, const char* what) {
  const kernels::NormDims d = check_norm(ctx, x, weight, bias, {&mean, &rstd}, what);
  check_like_x(ctx, out, x, d.dtype, what);
  if (residual.defined()) check_residual(ctx, d, sum, residual, x, what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::layernorm_forward(d, out.data_ptr(), mean.data_ptr(), rstd.data_ptr(),
                                    x.data_ptr(), data_or_null(residual), data_or_null(sum),
                                    weight.data_ptr(), data_or_null(bias), eps);
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::layernorm_forward(d, out.data_ptr(), f32_ptr(mean), f32_ptr(rstd), x.data_ptr(),
                                   data_or_null(residual), data_or_null(sum), weight.data_ptr(),
                                   data_or_null(bias), eps, ctx.stream().cuda_stream());
#endif
}

void rmsnorm_forward_impl(Context& ctx, const Tensor& sum, const Tensor& out, const Tensor& rstd,
                          const Tensor& x, const Tensor& residual, const Tensor& weight,
                          double eps, const char* what) {
  const kernels::NormDims d = check_norm(ctx, x, weight, Tensor(), {&rstd}, what);
  check_like_x(ctx, out, x, d.dtype, what);
  if (residual.defined()) check_residual(ctx, d, sum, residual, x, what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::rmsnorm_forward(d, out.data_ptr(), rstd.data_ptr(), x.data_ptr(),
                                  data_or_null(residual), data_or_null(sum), weight.data_ptr(),
                                  eps);
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::rmsnorm_forward(d, out.data_ptr(), f32_ptr(rstd), x.data_ptr(),
                                 data_or_null(residual), data_or_null(sum), weight.data_ptr(), eps,
                                 ctx.stream().cuda_stream());
#endif
}

}  // namespace

void layernorm_forward(Context& ctx, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                       const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  layernorm_forward_impl(ctx, Tensor(), out, mean, rstd, x, Tensor(), weight, bias, eps,
                         "layernorm_forward");
}

void add_layernorm_forward(Context& ctx, const Tensor& sum, const Tensor& out, const Tensor& mean,
                           const Tensor& rstd, const Tensor& x, const Tensor& residual,
                           const Tensor& weight, const Tensor& bias, double eps) {
  const char* what = "add_layernorm_forward";
  check_defined(residual, what);
  layernorm_forward_impl(ctx, sum, out, mean, rstd, x, residual, weight, bias, eps, what);
}

void layernorm_backward(Context& ctx, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                        const Tensor& dout, const Tensor& x, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, bool accumulate_dx,
                        bool accumulate, const Tensor& dx_addend) {
  const char* what = "layernorm_backward";
  kernels::NormDims d = check_norm(ctx, x, weight, Tensor(), {&mean, &rstd}, what);
  check_like_x(ctx, dout, x, d.dtype, what);
  if (dx.defined()) check_like_x(ctx, dx, x, x.dtype(), what);
  const void* addend = addend_or_dx(ctx, dx, dx_addend, x, accumulate_dx, what);
  check_param_grads(ctx, d, {&dweight, &dbias}, what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::layernorm_backward(d, data_or_null(dx), addend, data_or_null(dweight),
                                     data_or_null(dbias), dout.data_ptr(), x.data_ptr(),
                                     weight.data_ptr(), mean.data_ptr(), rstd.data_ptr(),
                                     accumulate);
    return;
  }
#if FSDP_WITH_CUDA
  Tensor workspace = ctx.empty(Shape{int64_t(kernels::cuda::norm_workspace_bytes(d))}, DType::u8);
  kernels::cuda::layernorm_backward(d, data_or_null(dx), addend, data_or_null(dweight),
                                    data_or_null(dbias), dout.data_ptr(), x.data_ptr(),
                                    weight.data_ptr(), f32_ptr(mean), f32_ptr(rstd), accumulate,
                                    workspace.data_ptr(), ctx.stream().cuda_stream());
#endif
}

void rmsnorm_forward(Context& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x,
                     const Tensor& weight, double eps) {
  rmsnorm_forward_impl(ctx, Tensor(), out, rstd, x, Tensor(), weight, eps, "rmsnorm_forward");
}

void add_rmsnorm_forward(Context& ctx, const Tensor& sum, const Tensor& out, const Tensor& rstd,
                         const Tensor& x, const Tensor& residual, const Tensor& weight,
                         double eps) {
  const char* what = "add_rmsnorm_forward";
  check_defined(residual, what);
  rmsnorm_forward_impl(ctx, sum, out, rstd, x, residual, weight, eps, what);
}

void rmsnorm_backward(Context& ctx, const Tensor& dx, const Tensor& dweight, const Tensor& dout,
                      const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      bool accumulate_dx, bool accumulate, const Tensor& dx_addend) {
  const char* what = "rmsnorm_backward";
  kernels::NormDims d = check_norm(ctx, x, weight, Tensor(), {&rstd}, what);
  check_like_x(ctx, dout, x, d.dtype, what);
  if (dx.defined()) check_like_x(ctx, dx, x, x.dtype(), what);
  const void* addend = addend_or_dx(ctx, dx, dx_addend, x, accumulate_dx, what);
  check_param_grads(ctx, d, {&dweight}, what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::rmsnorm_backward(d, data_or_null(dx), addend, data_or_null(dweight),
                                   dout.data_ptr(), x.data_ptr(), weight.data_ptr(),
                                   rstd.data_ptr(), accumulate);
    return;
  }
#if FSDP_WITH_CUDA
  Tensor workspace = ctx.empty(Shape{int64_t(kernels::cuda::norm_workspace_bytes(d))}, DType::u8);
  kernels::cuda::rmsnorm_backward(d, data_or_null(dx), addend, data_or_null(dweight),
                                  dout.data_ptr(), x.data_ptr(), weight.data_ptr(), f32_ptr(rstd),
                                  accumulate, workspace.data_ptr(), ctx.stream().cuda_stream());
#endif
}

}  // namespace fsdp::ops
