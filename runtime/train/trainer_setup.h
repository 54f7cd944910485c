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
#include "runtime/optim/optimizer.h"
#include "runtime/train/recipe.h"

namespace fsdp::train {

models::ModelConfig model_config_of(const Recipe& r);
// FSDP options for a recipe whose device has been resolved.
FsdpOptions fsdp_options_of(const Recipe& r);
OptimizerConfig optimizer_config_of(const Recipe& r);
models::Recompute recompute_of(const Recipe& r);
// The device a recipe runs on, once resolved (dist.device "cpu" or "cuda", not "auto").
DeviceType device_type_of(const Recipe& r);
MeshSizes mesh_sizes_of(const Recipe& r);
// The train and validation data of a recipe (validation: val_path, or the held-out tail
// of the training data when dataset.val_fraction > 0; `has_val` false when neither).
data::DataSpec train_data_of(const Recipe& r);
data::DataSpec val_data_of(const Recipe& r, bool* has_val);

// Bytes of activations one micro-batch keeps for backward on one rank (an estimate from the
// tensors the model's ops save, and the chunked classifier's logits buffer). Under tensor
// parallelism over `tp` ranks each keeps its share of the heads' and the MLP's tensors,
// and with sequence parallelism its share of the residual stream and the norms' outputs.
int64_t activation_bytes_estimate(const models::ModelConfig& c, int64_t micro_batch,
                                  int64_t seq_len, DType compute, models::Recompute recompute,
                                  int tp = 1, bool sequence_parallel = false);

}  // namespace fsdp::train
