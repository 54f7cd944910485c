// The update rules an Optimizer runs. The recipe's names ("adamw", "sgd") are converted once
// where the recipe is read, and written by name into checkpoint metadata.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/core/error.h"

namespace fsdp {

enum class OptimizerKind : uint8_t { adamw, sgd };

inline const char* optimizer_kind_name(OptimizerKind kind) {
  return kind == OptimizerKind::adamw ? "adamw" : "sgd";
}

// Accepts "adamw" | "sgd"; throws ConfigError naming the value otherwise.
inline OptimizerKind optimizer_kind_from_name(const std::string& name) {
  if (name == "adamw") return OptimizerKind::adamw;
  if (name == "sgd") return OptimizerKind::sgd;
  FSDP_THROW(ConfigError, "unknown optimizer '", name, "' (adamw or sgd)");
}

// Whether the rule keeps Adam's two moments per element.
inline bool has_moments(OptimizerKind kind) { return kind == OptimizerKind::adamw; }

}  // namespace fsdp
