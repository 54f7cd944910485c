// Rotary embeddings at the Tensor level (kernels/ops.h has the conventions):
// kernels/rope.cc routes them to kernels/cpu/rope.h or kernels/cuda/rope.h.
#pragma once

#include <cstdint>

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp::ops {

// out = q or k rotated: x (B, T, H, D) (any strides for B, T, H; D contiguous) by angle
// t * theta^(-2i/D) for the pair (i, i + D/2) ("rotate half", as Llama in Hugging Face).
// inverse = true applies the opposite rotation (the backward of the forward rotation).
// Row t is at position position_offset + t (new tokens after a key/value cache's). out has
// x's shape and dtype, any strides with D contiguous, and is x itself or shares no memory
// with it: a strided view of a fused projection rotates into a contiguous tensor in one
// pass.
void rope(Context& ctx, const Tensor& out, const Tensor& x, double theta, bool inverse,
          int64_t position_offset = 0);
// rope in place: x = rope(x).
void rope_apply(Context& ctx, const Tensor& x, double theta, bool inverse,
                int64_t position_offset = 0);

}  // namespace fsdp::ops
