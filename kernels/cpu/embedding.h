// CPU token and position embeddings.
#pragma once

#include <cstdint>

#include "kernels/nn_shapes.h"
#include "runtime/core/dtype.h"

namespace fsdp::kernels::cpu {

// out (B, T, C) = wte[idx] (+ wpe[t] when wpe is not null). Throws IndexError for an index
// outside [0, vocab_total). A shard's table (d.vocab_begin) gives zero rows for the ids it
// does not hold, and its backward skips them.
void embedding_forward(const EmbeddingDims& d, void* out, const int32_t* idx, const void* wte,
                       const void* wpe);
// dwte[idx[b, t]] += dout[b, t] in (b, t) order; dwpe[t] += sum over b (null: skipped).
void embedding_backward(const EmbeddingDims& d, void* dwte, void* dwpe, const void* dout,
                        const int32_t* idx);

}  // namespace fsdp::kernels::cpu
