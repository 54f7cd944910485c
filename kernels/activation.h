// GELU and SwiGLU at the Tensor level (kernels/ops.h has the conventions):
// kernels/activation.cc routes them to kernels/cpu/activation.h or kernels/cuda/activation.h.
#pragma once

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp::ops {

// GELU, tanh approximation (GPT-2's): out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(Context& ctx, const Tensor& out, const Tensor& x);
void gelu_backward(Context& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x);
// SwiGLU on a fused projection: x (N, 2F) = [gate | up]; out (N, F) = silu(gate) * up.
void swiglu_forward(Context& ctx, const Tensor& out, const Tensor& x);
void swiglu_backward(Context& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x);

}  // namespace fsdp::ops
