// Context parallelism inside the attention: the causal self-attention of a sequence split
// over a context-parallel group as ContextParallelLayout says.
#pragma once

#include <cstdint>

#include "runtime/autograd/graph.h"
#include "runtime/nn/context_parallel_layout.h"
#include "runtime/nn/tensor_parallel.h"

namespace fsdp::nn {

// How the ranks exchange keys and values (Megatron's cp_comm_type).
enum class ContextParallelComm : uint8_t {
  all_gather,  // every rank's keys and values gathered; their gradients reduce-scattered back
  ring,        // "p2p": the keys and values pass around the ring, one rank's per step, and
               // the partial results merge by their log-sum-exps (ops::attention_merge);
               // backward sends their gradients around with them, home after cp steps
};

// Causal self-attention of a sequence split over a context-parallel group. qkv
// (B, T/cp, (H + 2 Hkv) D) holds this rank's tokens in `layout`'s order; returns
// (B, T/cp, H D), what causal_attention gives those tokens of the whole sequence (rotary
// embeddings at their positions when rope_theta > 0).
Tensor context_parallel_attention(Graph& g, const Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                                  double rope_theta, const ContextParallelLayout& layout,
                                  ParallelGroup& group,
                                  ContextParallelComm comm = ContextParallelComm::all_gather);

}  // namespace fsdp::nn
