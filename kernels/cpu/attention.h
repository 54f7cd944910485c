// CPU causal grouped-query attention, the numerical reference for cuDNN's fused attention
// and our CUDA fallback. Computed in double, one (batch, key/value head) group per OpenMP
// task, so results do not depend on the number of threads.
#pragma once

#include "kernels/nn_shapes.h"
#include "runtime/core/dtype.h"

namespace fsdp::kernels::cpu {

// out (B, T, H, D) at d.out strides; lse (B, H, T) contiguous; q/k/v at their strides.
// Every tensor has `dtype` (f32 or f64), lse included.
void attention_forward(const AttentionDims& d, void* out, void* lse, const void* q, const void* k,
                       const void* v, DType dtype);
// dq/dk/dv (overwritten) and dout at d.dq/dk/dv/dout strides. With d.past > 0 the queries
// follow d.past keys (as in the forward): k, v, dk and dv hold d.past + d.seq rows.
void attention_backward(const AttentionDims& d, void* dq, void* dk, void* dv, const void* dout,
                        const void* out, const void* lse, const void* q, const void* k,
                        const void* v, DType dtype);

// Context parallelism's ring: a block's attention (block_out (B, T, H, D) of `dtype`,
// block_lse (B, H, T)) merged into the running result, per query row:
//   lse' = log(exp(lse) + exp(block_lse)),
//   out' = out exp(lse - lse') + block_out exp(block_lse - lse').
// out and lse have the statistics dtype of `dtype` (lse = -inf and out = 0: nothing yet).
// All contiguous.
void attention_merge(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, void* out,
                     void* lse, const void* block_out, const void* block_lse, DType dtype);

}  // namespace fsdp::kernels::cpu
