// Helpers shared by the checkpoint tests: scratch directories every rank sees, snapshots of
// directories, and a tiny model trained with the low-level pieces (as
// tests/fsdp/sharded_parity_test.cc does), whose state can be saved, loaded and compared.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "models/language_model.h"
#include "runtime/core/context.h"
#include "runtime/fsdp/sharded_model.h"
#include "runtime/nn/expert_parallel.h"
#include "runtime/optim/optimizer.h"

namespace fsdp::testing {

// An empty directory shared by every rank of the test job: rank 0 creates it afresh, then
// every rank waits for it (MPI barrier when run under mpirun).
std::string shared_scratch_dir(const std::string& name);
void barrier_all_ranks();

// Relative path -> SHA-256 of the content, for every file under `dir` (recursively).
std::map<std::string, std::string> snapshot_directory(const std::string& dir);

// The model of the tiny runs: GPT-2 (tied) or Llama (untied, GQA), 2 blocks, width 32,
// vocabulary 96 padded to 128, 16 positions.
models::ModelConfig tiny_model_config(bool llama);
// The tiny Llama with every MLP a mixture of 4 experts (top 2, hidden 24; softmax scores
// renormalized, no shared expert, no expert bias: a Mixtral, so that it exports).
models::ModelConfig tiny_moe_config();

// A tiny model sharded over `groups`, with AdamW, trained on a fixed synthetic data set.
// Every step covers the same kGlobalMicroBatches global micro-batches whatever the
// data-parallel size (dp ranks x accumulation), so runs of any layout see the same data.
class TinyTraining {
 public:
  static constexpr int kGlobalMicroBatches = 4;
  static constexpr int64_t kBatch = 2, kSeq = 16;

  TinyTraining(ShardingStrategy strategy, const DataParallelGroups& groups, int dp_rank,
               int dp_size, bool llama = false);
  // A model of `config`; with `expert_parallel` (a group of more than one rank, whose ranks
  // take different data: dp_rank and dp_size count them) its MoE layers' experts are split
  // over that group (apply_expert_parallel) and sharded over groups.part_groups().
  TinyTraining(const models::ModelConfig& config, ShardingStrategy strategy,
               const DataParallelGroups& groups, int dp_rank, int dp_size,
               Communicator* expert_parallel = nullptr);
  ~TinyTraining();

  // Runs steps [from, to) (global step indices: they select the data) and returns each
  // step's mean loss over every rank's micro-batches (exact: f64 sums of f32 values).
  std::vector<double> train(int64_t from, int64_t to);

  // This rank's state (master weights, then both moments, per unit) as bytes: equal
  // snapshots mean equal state.
  std::vector<uint8_t> state_bytes();

  Context ctx;
  std::unique_ptr<nn::ExpertParallelGroup> experts;  // before the model, which points to it
  std::unique_ptr<models::LanguageModel> model;
  DataParallelGroups groups;
  std::unique_ptr<ShardedModel> sharded;
  std::unique_ptr<Optimizer> optimizer;
  int dp_rank = 0, dp_size = 1;
};

}  // namespace fsdp::testing
