// The pieces a Trainer is built from, derived from a resolved recipe. Shared by the trainer,
// the dry run and tools/bench (private to runtime/train and tools).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "collectives/mesh.h"
#include "models/config.h"
#include "models/factory.h"
#include "runtime/data/data_loader.h"
#include "runtime/fsdp/sharded_model.h"
#include "runtime/nn/tensor_parallel.h"
#include "runtime/optim/optimizer.h"
#include "runtime/parallel/expert_parallel.h"
#include "runtime/parallel/fp8_plan.h"
#include "runtime/train/recipe.h"

namespace fsdp::train {

models::ModelConfig model_config_of(const Recipe& r);
// FSDP options for a recipe whose device has been resolved.
FsdpOptions fsdp_options_of(const Recipe& r);
// ConfigError for optimizer.cpu_offload on the CPU (every buffer is in host memory there),
// unless offload_on_cpu (tests only: TrainerOptions::offload_on_cpu).
void check_offload_device(const Recipe& r, bool offload_on_cpu = false);
OptimizerConfig optimizer_config_of(const Recipe& r);

models::Recompute recompute_of(const Recipe& r);
// The device a recipe runs on, once resolved (dist.device "cpu" or "cuda", not "auto").
DeviceType device_type_of(const Recipe& r);
MeshSizes mesh_sizes_of(const Recipe& r);
// The train and validation data of a recipe (validation: val_path, or the held-out tail
// of the training data when dataset.val_fraction > 0; `has_val` false when neither).
data::DataSpec train_data_of(const Recipe& r);
data::DataSpec val_data_of(const Recipe& r, bool* has_val);

// The groups a model splits over; null where that parallelism is off.
struct ModelParallelGroups {
  nn::ParallelGroup* tensor = nullptr;
  nn::ParallelGroup* context = nullptr;
  nn::ExpertParallelGroup* expert = nullptr;
};
// Applies a recipe's model parallelism to `model`'s specs, the same way for the trainer (its
// rank's groups) and the dry run (planning groups of the mesh's sizes): tensor parallelism
// first (it slices the specs that FSDP then shards), then context and expert parallelism.
// FP8 is a plan of its own (apply_fp8), applied after these.
void apply_model_parallel(models::LanguageModel& model, const Recipe& r,
                          const ModelParallelGroups& groups);

// The FP8 plan of a recipe with mixed_precision.fp8 set: formats, scaling and the blocks
// kept in bf16 (the trainer adds its context-parallel group). Delayed scaling's state is
// set up apart (Fp8DelayedScaling); the plan starts it as tensorwise.
Fp8Plan fp8_plan_of(const Recipe& r);
// The start-up report's line on FP8: recipe, how many layers run in FP8, what stays in bf16.
std::string fp8_summary(const Recipe& r, const Fp8Report& report);
// Per block, in forward order: whether it has linear layers an FP8 plan marked.
std::vector<bool> fp8_block_mask(models::LanguageModel& model);
// Bytes of the FP8 weight casts held for a step (nn::Fp8Recipe::cache_weight): one byte per
// element of each such weight in each of its two layouts.
int64_t fp8_weight_cast_bytes(models::LanguageModel& model);

// Bytes of activations one micro-batch keeps for backward on one rank (an estimate from the
// tensors the model's ops save, and the chunked classifier's logits buffer). Under tensor
// parallelism over `tp` ranks each keeps its share of the heads' and the MLP's tensors,
// and with sequence parallelism its share of the residual stream and the norms' outputs.
// In the blocks `fp8_blocks` marks (one flag per block; empty: none) the linear layers keep
// FP8 copies of their inputs (one byte per element) for their weight gradients instead of
// the inputs themselves. Under full recompute, `recomputed_blocks` >= 0 recomputes only the
// first that many blocks (the others keep what they keep without recompute); -1: all.
// `cp`: the context-parallel size (`seq_len` is already a rank's share of the sequence).
int64_t activation_bytes_estimate(const models::ModelConfig& c, int64_t micro_batch,
                                  int64_t seq_len, DType compute, models::Recompute recompute,
                                  int tp = 1, bool sequence_parallel = false,
                                  const std::vector<bool>& fp8_blocks = {},
                                  int64_t recomputed_blocks = -1, int cp = 1);

}  // namespace fsdp::train
