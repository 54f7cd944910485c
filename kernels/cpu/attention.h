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

}  // namespace fsdp::kernels::cpu
