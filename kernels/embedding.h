// Token and position embeddings at the Tensor level (kernels/ops.h has the conventions):
// kernels/embedding.cc routes them to kernels/cpu/embedding.h or kernels/cuda/embedding.h.
#pragma once

#include <cstdint>

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp::ops {

// Which ids a token table's rows are: [begin, begin + V) of a vocabulary of `total` ids (a
// vocabulary-parallel shard); total 0: the table is whole.
struct VocabShard {
  int64_t begin = 0, total = 0;
};
// out (B, T, C) = wte[idx] (+ wpe[t] when wpe is defined). idx (B, T) i32, wte (V, C), wpe (T', C).
// out has the tables' dtype, or f32 beside bf16 tables (CUDA). A shard's table gives zero
// rows (plus the positions) for the ids it does not hold.
void embedding_forward(Context& ctx, const Tensor& out, const Tensor& idx, const Tensor& wte,
                       const Tensor& wpe = Tensor(), const VocabShard& shard = {});
// dwte (V, C) += scatter of dout rows by idx (a shard's rows only); dwpe (T', C) += sum over
// B of dout. Always accumulates (a tied embedding also receives the classifier's
// gradient). Deterministic.
void embedding_backward(Context& ctx, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                        const Tensor& idx, const VocabShard& shard = {});

}  // namespace fsdp::ops
