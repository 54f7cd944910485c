// CUDA kernels: token and position embeddings (the twins of kernels/cpu/embedding.h).
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

// ---- embeddings. Token ids must lie in [0, vocab_total) (not checked on the device); a
// shard's table (d.vocab_begin, d.vocab rows) gives zero rows for the ids it does not hold
// and no gradient to them.
void embedding_forward(const EmbeddingDims& d, void* out, const int32_t* idx, const void* wte,
                       const void* wpe, stream_t stream);
// Deterministic scatter-add: the positions of each token id are gathered into a bucket,
// sorted, and summed in position order by one block per id (no float atomics).
size_t embedding_backward_workspace_bytes(const EmbeddingDims& d);
void embedding_backward(const EmbeddingDims& d, void* dwte, void* dwpe, const void* dout,
                        const int32_t* idx, void* workspace, stream_t stream);

}  // namespace fsdp::kernels::cuda
