// CUDA kernels: our own causal grouped-query attention for bf16 problems cuDNN cannot run
// (f32 runs through attention_gemm.h); the twins of kernels/cpu/attention.h.
// Raw pointers, sizes and a stream; nothing here synchronizes with the host. Compute dtypes
// are bf16 and f32, computed and accumulated in f32; statistics (mean, rstd, lse, losses) are
// f32. Scratch memory is passed in by the caller (sizes from the *_workspace_bytes helpers),
// so every launch is asynchronous and allocation-free.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/basic.h"
#include "kernels/nn_shapes.h"
#include "kernels/scalar_math.h"

namespace fsdp::kernels::cuda {

// ---- our own causal GQA attention (any head_dim, any strides, bf16 or f32), used where
// cuDNN's fused attention cannot run, and for queries after d.past earlier keys (forward
// and backward: k, v, dk, dv hold d.past + d.seq rows). lse (B, H, T) f32.
void attention_forward(const AttentionDims& d, void* out, float* lse, const void* q, const void* k,
                       const void* v, DType dtype, stream_t stream);
size_t attention_backward_workspace_bytes(const AttentionDims& d);
void attention_backward(const AttentionDims& d, void* dq, void* dk, void* dv, const void* dout,
                        const void* out, const float* lse, const void* q, const void* k,
                        const void* v, DType dtype, void* workspace, stream_t stream);

// Context parallelism's ring: a block's attention merged into the running result (the twin
// of kernels/cpu/attention.h's attention_merge). out (B, T, H, D) and lse (B, H, T) f32;
// block_out of `dtype` (bf16 or f32), block_lse f32. All contiguous.
void attention_merge(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, float* out,
                     float* lse, const void* block_out, const float* block_lse, DType dtype,
                     stream_t stream);

}  // namespace fsdp::kernels::cuda
