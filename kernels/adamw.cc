// Dispatch of the fused AdamW step (kernels/adamw.h).
#include "kernels/adamw.h"

#include <cmath>

#include "kernels/checks.h"
#include "kernels/cpu/adamw_f32.h"
#include "kernels/cpu/adamw.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/adamw.h"
#endif

namespace fsdp::ops {
namespace {

using namespace detail;

// Checks the operands of an AdamW step and describes them for the kernels.
kernels::AdamWBuffers adamw_buffers(Context& ctx, const Tensor& param, const Tensor& grad,
                                    const Tensor& exp_avg, const Tensor& exp_avg_sq,
                                    const AdamWParams& p, const Tensor& param_copy,
                                    const char* what) {
  const int64_t n = param.numel();
  check_flat(ctx, param, n, what);
  FSDP_CHECK(param.dtype() == DType::f32 || param.dtype() == DType::f64, DTypeError, what,
             ": the updated parameter must be f32 or f64 (the master copy), got ", param.str());
  check_flat(ctx, grad, n, what);
  check_flat(ctx, exp_avg, n, what);
  check_flat(ctx, exp_avg_sq, n, what);
  check_same_dtype(exp_avg, exp_avg_sq, what);
  if (param_copy.defined()) check_flat(ctx, param_copy, n, what);
  FSDP_CHECK(p.step >= 1, ValueError, what, ": step counts from 1, got ", p.step);
  FSDP_CHECK(p.beta1 >= 0 && p.beta1 < 1 && p.beta2 >= 0 && p.beta2 < 1, ValueError, what,
             ": betas must lie in [0, 1), got ", p.beta1, ", ", p.beta2);
  kernels::AdamWBuffers buf;
  buf.param = param.data_ptr();
  buf.param_dtype = param.dtype();
  buf.grad = grad.data_ptr();
  buf.grad_dtype = grad.dtype();
  buf.exp_avg = exp_avg.data_ptr();
  buf.exp_avg_sq = exp_avg_sq.data_ptr();
  buf.moment_dtype = exp_avg.dtype();
  buf.param_copy = data_or_null(param_copy);
  if (param_copy.defined()) buf.copy_dtype = param_copy.dtype();
  return buf;
}

kernels::AdamWScalars adamw_scalars(const AdamWParams& p) {
  kernels::AdamWScalars s;
  s.lr = p.lr;
  s.beta1 = p.beta1;
  s.beta2 = p.beta2;
  s.eps = p.eps;
  s.weight_decay = p.weight_decay;
  s.grad_scale = p.grad_scale;
  s.bias_correction1 = 1.0 - std::pow(p.beta1, double(p.step));
  s.sqrt_bias_correction2 = std::sqrt(1.0 - std::pow(p.beta2, double(p.step)));
  return s;
}

}  // namespace

void adamw_step(Context& ctx, const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWParams& p, const Tensor& param_copy) {
  const kernels::AdamWBuffers buf =
      adamw_buffers(ctx, param, grad, exp_avg, exp_avg_sq, p, param_copy, "adamw_step");
  const kernels::AdamWScalars s = adamw_scalars(p);
  if (ctx.device().is_cpu()) {
    kernels::cpu::adamw_step(buf, param.numel(), s);
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::adamw_step(buf, param.numel(), s, ctx.stream().cuda_stream());
#endif
}

void adamw_step_host_f32(Context& host, const Tensor& param, const Tensor& grad,
                         const Tensor& exp_avg, const Tensor& exp_avg_sq, const AdamWParams& p,
                         const Tensor& param_copy) {
  const char* what = "adamw_step_host_f32";
  FSDP_CHECK(host.device().is_cpu(), DeviceError, what, ": needs a CPU context, got ",
             host.device().str());
  const kernels::AdamWBuffers buf =
      adamw_buffers(host, param, grad, exp_avg, exp_avg_sq, p, param_copy, what);
  kernels::cpu::adamw_step_f32(buf, param.numel(), adamw_scalars(p));
}

}  // namespace fsdp::ops
