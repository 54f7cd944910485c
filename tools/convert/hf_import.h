// Import of a Hugging Face model directory (config.json and model.safetensors, or a sharded
// model-0000i-of-0000n.safetensors set with model.safetensors.index.json) as initial weights:
// our parameters in f32, then a native step-0 checkpoint (weights only) that
// `train ... checkpoint.load=SAVE_DIR` starts training from, resharded to any world size.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "models/config.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp::convert {

struct HfModel {
  models::ModelConfig config;
  std::map<std::string, Tensor> params;  // our names -> f32 host tensors of our shapes
};

// Reads the model. Strict: ConfigError for a config.json our models cannot express;
// CheckpointError naming the file and tensor for a tensor that is missing, of another
// shape or not a floating type, or unknown (neither one of the model's nor an ignorable
// buffer). Padding rows of the vocabulary are zero.
HfModel read_hf_model(Context& ctx, const std::string& hf_dir, int64_t padded_vocab_size = 0);

// The resolved recipe (JSON) of a run of model `c` (its MoE keys too) with every other key
// at its default; kept in the imported checkpoint so that tools can tell which model it holds.
std::string recipe_json_for(const models::ModelConfig& c);

// Writes the model as SAVE_DIR/step_000000 (and SAVE_DIR/latest). Returns the step directory.
std::string write_step0_checkpoint(Context& ctx, const HfModel& model, const std::string& save_dir);

}  // namespace fsdp::convert
