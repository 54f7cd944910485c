// Context parallelism inside the attention: the causal self-attention of a sequence split
// over a context-parallel group as ContextParallelLayout says.
#pragma once

#include <cstdint>

#include "runtime/autograd/graph.h"
#include "runtime/nn/context_parallel_layout.h"
#include "runtime/nn/tensor_parallel.h"

namespace fsdp::nn {

// Causal self-attention of a sequence split over a context-parallel group (the keys and
// values are all-gathered: Megatron's cp_comm_type "all_gather"). qkv (B, T/cp, (H + 2 Hkv) D)
// holds this rank's tokens in `layout`'s order; returns (B, T/cp, H D), what
// causal_attention gives those tokens of the whole sequence (rotary embeddings at their
// positions when rope_theta > 0). Backward reduce-scatters the keys' and values' gradients
// back to the ranks that hold them.
Tensor context_parallel_attention(Graph& g, const Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                                  double rope_theta, const ContextParallelLayout& layout,
                                  TensorParallelGroup& group);

}  // namespace fsdp::nn
