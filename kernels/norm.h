// LayerNorm and RMSNorm at the Tensor level (kernels/ops.h has the conventions):
// kernels/norm.cc routes them to kernels/cpu/norm.h or kernels/cuda/norm.h.
#pragma once

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp::ops {

// LayerNorm over the last dim: x (N, C), weight/bias (C); out (N, C); mean/rstd (N). out and
// dout have the weight's dtype; x and dx the same, or f32 beside bf16 weights (CUDA).
void layernorm_forward(Context& ctx, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                       const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
// dx (N, C) (+= when accumulate_dx); dweight, dbias (C) (+= when accumulate). With dx_addend
// (x's dtype and shape; accumulate_dx false): dx = dx_addend + the norm's gradient, for a
// gradient that reached x by another path and must not be modified in place.
void layernorm_backward(Context& ctx, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                        const Tensor& dout, const Tensor& x, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, bool accumulate_dx,
                        bool accumulate, const Tensor& dx_addend = Tensor());
// RMSNorm: out = x * rstd * weight; rstd (N).
void rmsnorm_forward(Context& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x,
                     const Tensor& weight, double eps);
void rmsnorm_backward(Context& ctx, const Tensor& dx, const Tensor& dweight, const Tensor& dout,
                      const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      bool accumulate_dx, bool accumulate, const Tensor& dx_addend = Tensor());
// The residual add fused into the norm that follows it: sum = x + residual (x's dtype, as
// ops::add rounds it; residual has the weight's dtype) and out = norm(sum), in one pass.
void add_layernorm_forward(Context& ctx, const Tensor& sum, const Tensor& out, const Tensor& mean,
                           const Tensor& rstd, const Tensor& x, const Tensor& residual,
                           const Tensor& weight, const Tensor& bias, double eps);
void add_rmsnorm_forward(Context& ctx, const Tensor& sum, const Tensor& out, const Tensor& rstd,
                         const Tensor& x, const Tensor& residual, const Tensor& weight,
                         double eps);

}  // namespace fsdp::ops
