// CPU GELU (tanh form) and SwiGLU, forward and backward, on contiguous f32/f64 data.
#pragma once

#include <cstdint>

#include "runtime/core/dtype.h"

namespace fsdp::kernels::cpu {

// out (n) = gelu(x); dx (n) = dout * gelu'(x). dx may alias dout.
void gelu_forward(void* out, const void* x, int64_t n, DType dtype);
void gelu_backward(void* dx, const void* dout, const void* x, int64_t n, DType dtype);

// x (rows, 2F) = [gate | up]; out (rows, F) = silu(gate) * up; dx (rows, 2F).
void swiglu_forward(void* out, const void* x, int64_t rows, int64_t features, DType dtype);
void swiglu_backward(void* dx, const void* dout, const void* x, int64_t rows, int64_t features,
                     DType dtype);

}  // namespace fsdp::kernels::cpu
