// The fused AdamW step at the Tensor level (kernels/ops.h has the conventions):
// kernels/adamw.cc routes it to kernels/cpu/adamw.h (or adamw_f32.h, the offloaded
// optimizer's) or kernels/cuda/adamw.h.
#pragma once

#include <cstdint>

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp::ops {

struct AdamWParams {
  double lr = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0;  // decoupled: param -= lr * weight_decay * param
  int64_t step = 1;         // 1 for the first update (bias correction uses it)
  double grad_scale = 1;    // gradients are multiplied by this first (clipping, 1/N)
};
// One fused AdamW update of n elements: param (f32 master or f64), grad (any floating),
// exp_avg / exp_avg_sq (f32, or bf16 to save memory). When `param_copy` is defined it
// receives the updated parameter in its own dtype (the bf16 compute weights).
void adamw_step(Context& ctx, const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWParams& p, const Tensor& param_copy = Tensor());
// The same update on host tensors computed in f32, with the CUDA kernel's roundings, at the
// speed of the host's memory (the CPU reference above computes in double): the
// CPU-offloaded optimizer's update. f32 master weights; gradient, moments and copy f32 or
// bf16.
void adamw_step_host_f32(Context& host, const Tensor& param, const Tensor& grad,
                         const Tensor& exp_avg, const Tensor& exp_avg_sq, const AdamWParams& p,
                         const Tensor& param_copy = Tensor());

}  // namespace fsdp::ops
