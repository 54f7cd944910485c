// The model `generate` samples from: a native checkpoint (saved with any world size and
// strategy) or a Hugging Face directory (as `convert export` writes it), read whole into an
// unsharded model on one device.
#pragma once

#include <memory>
#include <string>

#include "models/language_model.h"
#include "runtime/core/context.h"

namespace fsdp::generate {

// `path`: a Hugging Face model directory (it holds config.json), a checkpoint step
// directory (metadata.json), or a save directory (its `latest`). A native checkpoint's
// files are verified against their recorded SHA-256 first. Weights are converted to
// `dtype` on ctx's device. CheckpointError / ConfigError naming the path and what is wrong.
std::unique_ptr<models::LanguageModel> load_model(Context& ctx, const std::string& path,
                                                  DType dtype);

}  // namespace fsdp::generate
