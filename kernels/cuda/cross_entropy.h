// CUDA kernels: the fused cross-entropy (the twins of kernels/cpu/cross_entropy.h).
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

// ---- fused cross-entropy: one block per row. losses and lse (rows) are f32.
void cross_entropy_forward(const CrossEntropyDims& d, float* losses, float* lse,
                           const void* logits, const int32_t* targets, stream_t stream);
void cross_entropy_backward(const CrossEntropyDims& d, void* dlogits, const void* logits,
                            const float* lse, const int32_t* targets, double dloss,
                            stream_t stream);
// Both in one launch, in place: losses (rows) f32, and with write_grad the logits replaced
// by (softmax - onehot) * dloss (the chunked classifier).
void cross_entropy_forward_backward(const CrossEntropyDims& d, float* losses, void* logits,
                                    const int32_t* targets, double dloss, bool write_grad,
                                    stream_t stream);

// ---- vocabulary parallelism (the twins of kernels/cpu/cross_entropy.h's shard kernels):
// partials (3, rows) f32 per shard; the merge takes (shards, 3, rows) and writes losses and
// lse (rows) f32. The backward above writes a shard's columns (d.vocab_begin).
void cross_entropy_shard_stats(const CrossEntropyDims& d, float* partials, const void* logits,
                               const int32_t* targets, stream_t stream);
void cross_entropy_merge_shards(int64_t rows, int64_t shards, float* losses, float* lse,
                                const float* partials, const int32_t* targets, stream_t stream);

}  // namespace fsdp::kernels::cuda
