// The matrices Muon updates in a model (optimizer.optimizer = "muon"), read from the model's
// layer table, as the other plans read it:
//   column_heads   the fused [q | k | v] weight: q, k and v as separate matrices (or the
//                  whole weight as one, without split_qkv)
//   column         its weight, each of its `parts` ([gate | up]) a matrix
//   row            its weight
//   experts        each expert's matrices (SwiGLU's gate_up as gate and up)
// Everything else (embeddings, the head, norms, biases, MoE routers) gets AdamW. A weight
// tensor parallelism slices is made whole over the tensor-parallel group for its update (the
// owner's peers in the group take part); expert-parallel weights need nothing (each expert
// is whole on the ranks holding it).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/fsdp/sharded_model.h"
#include "runtime/nn/layer_table.h"
#include "runtime/nn/module.h"
#include "runtime/optim/muon_layout.h"
#include "runtime/optim/optimizer.h"

namespace fsdp {

class MuonMatrices {
 public:
  // `tensor_parallel`: the group that slices the model's layers (null: none).
  MuonMatrices(nn::Module& model, const nn::LayerTable& table, Communicator* tensor_parallel,
               bool split_qkv = true);
  MuonMatrices(const MuonMatrices&) = delete;
  MuonMatrices& operator=(const MuonMatrices&) = delete;

  const std::vector<MuonParamSpec>& specs() const { return specs_; }

 private:
  void add(nn::Parameter& weight, std::vector<int64_t> row_parts, bool batched,
           Communicator* tensor_parallel);

  std::vector<MuonParamSpec> specs_;
  std::vector<std::unique_ptr<WholeMatrix>> wholes_;
};

// The names of the parameters Muon takes (those MuonMatrices lists), for memory estimates,
// which need no group.
std::vector<std::string> muon_param_names(nn::Module& model, const nn::LayerTable& table);

// Muon's layout over `sharded`'s units (its matrices `specs`), each unit's shard group the one
// it is sharded over, exchanging in the momentum's precision (f64 moments: f64, else f32)
// through `sharded`'s collective calls (counted and timed with the step's).
std::unique_ptr<MuonOrthogonalizer> muon_orthogonalizer(Context& ctx, ShardedModel& sharded,
                                                        const std::vector<MuonParamSpec>& specs,
                                                        const OptimizerConfig& config);

}  // namespace fsdp
