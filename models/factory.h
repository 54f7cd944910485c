// Building models from configs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "models/config.h"
#include "models/language_model.h"

namespace fsdp::models {

// The model of config.family, as specs (no memory allocated).
std::unique_ptr<LanguageModel> build_model(const ModelConfig& config);

// Total parameter elements of the model a config describes (each shared parameter once).
// GPT-2 d12: 124,475,904.
int64_t count_parameters(const ModelConfig& config);

// Activation recompute: none; full recomputes every block (keeping only its input);
// selective recomputes every MLP's activation (GELU or SwiGLU output, the largest tensor a
// block saves) from its saved input, an elementwise pass instead of any matmul.
enum class Recompute : uint8_t { none, full, selective };
const char* recompute_name(Recompute mode);  // "none", "full", "selective"
// Accepts those names; throws ConfigError naming the value otherwise.
Recompute recompute_from_name(const std::string& name);
// `full_blocks` >= 0 recomputes only the first that many blocks under full (Megatron's
// recompute_method "block" with recompute_num_layers); -1: every block. ConfigError when
// it exceeds the model's blocks.
void set_activation_recompute(LanguageModel& model, Recompute mode, int64_t full_blocks = -1);

}  // namespace fsdp::models
