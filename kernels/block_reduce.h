// Per-block reductions with a fixed summation order, for results that must not depend on
// how a buffer is split across ranks (the global gradient norm of sharded training), at the
// Tensor level: kernels/block_reduce.cc routes them to kernels/cpu/block_reduce.h or
// kernels/cuda/block_reduce.h.
#pragma once

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp::ops {

// partials[i] = sum of x[i*block .. (i+1)*block)^2 over a contiguous x whose numel is a
// multiple of `block`. f32 output (f64 for f64 input). Each block is summed in one fixed
// order, so equal blocks give bitwise equal partials on any rank.
Tensor block_sum_squares(Context& ctx, const Tensor& x, int64_t block);

}  // namespace fsdp::ops
