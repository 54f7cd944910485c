// `convert init`: the weights a training run starts from, for programs that replay the run
// elsewhere (tools/parity/curve.py trains a PyTorch twin from them).
#pragma once

#include <string>

#include "models/config.h"
#include "runtime/train/recipe.h"

namespace fsdp::convert {

// Writes the initial master weights of a run of `recipe` (in mixed_precision.main_params_dtype)
// as one safetensors file: fsdp.cpp's parameter names, full shapes, and the model config as
// metadata (models::config_metadata, plus "seed" and "dtype"). Every element comes from the
// counter-based initializer keyed by (run.seed, name, index), exactly as each rank draws its
// own shard in a run, so this is step 0 of that run whatever its layout. Returns the config.
models::ModelConfig write_initial_weights(const train::Recipe& recipe, const std::string& path);

}  // namespace fsdp::convert
