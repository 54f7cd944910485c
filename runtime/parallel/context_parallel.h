// Context parallelism applied from outside a model: every attention layer runs over the
// whole sequence while each rank of the context-parallel group holds only its tokens
// (nn::ContextParallelLayout: chunks r and 2·cp − 1 − r of each sequence, for causal load
// balancing). The keys and values are all-gathered or passed around a ring (Megatron's
// cp_comm_type "all_gather" and "p2p"); rotary embeddings and learned positions take each
// chunk's positions. The data, the loss
// and the gradient reduction are the trainer's and FSDP's part: each rank reads the same
// sequences as its group and keeps its chunks (split_sequences), the loss is averaged over
// every token of the group, and FSDP shards and reduces over the data-parallel ranks times
// the context-parallel ones.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/nn/context_parallel.h"
#include "runtime/nn/layer_table.h"
#include "runtime/nn/module.h"
#include "runtime/nn/tensor_parallel.h"

namespace fsdp {

// Sets every attention layer `table` names in `model` (specs or materialized) to run
// context-parallel over
// `group` for sequences of `seq_len` tokens, and the learned position table (if any) to be
// read at this rank's positions. Returns one line per layer. A group of size 1 leaves the
// model as it is. ShapeError unless seq_len splits into 2 x group.size() chunks.
std::vector<std::string> apply_context_parallel(
    nn::Module& model, const nn::VocabularyTables& vocabulary, const nn::LayerTable& table,
    nn::ParallelGroup& group, int64_t seq_len,
    nn::ContextParallelComm comm = nn::ContextParallelComm::all_gather);
// "p2p" (the ring) or "all_gather" (Megatron's names); ConfigError otherwise.
nn::ContextParallelComm context_parallel_comm(const std::string& name);

// This rank's tokens of each of `batch` sequences of layout.seq tokens: rows (batch, T)
// row-major -> (batch, T / cp), chunk by chunk in the layout's order.
std::vector<int32_t> split_sequences(const std::vector<int32_t>& rows, int64_t batch,
                                     const nn::ContextParallelLayout& layout);

}  // namespace fsdp
