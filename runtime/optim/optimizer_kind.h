// The update rules an Optimizer runs. The recipe's names ("adamw", "muon", "sgd") are
// converted once where the recipe is read, and written by name into checkpoint metadata.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/core/error.h"

namespace fsdp {

// muon: Muon on the blocks' matrices (their momentum orthogonalized), AdamW on the rest.
enum class OptimizerKind : uint8_t { adamw, sgd, muon };

inline const char* optimizer_kind_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::adamw: return "adamw";
    case OptimizerKind::muon: return "muon";
    case OptimizerKind::sgd: break;
  }
  return "sgd";
}

// Accepts "adamw" | "muon" | "sgd"; throws ConfigError naming the value otherwise.
inline OptimizerKind optimizer_kind_from_name(const std::string& name) {
  if (name == "adamw") return OptimizerKind::adamw;
  if (name == "muon") return OptimizerKind::muon;
  if (name == "sgd") return OptimizerKind::sgd;
  FSDP_THROW(ConfigError, "unknown optimizer '", name, "' (adamw, muon or sgd)");
}

// Whether the rule keeps Adam's two moments (checkpoint kinds exp_avg, exp_avg_sq). Muon's
// momentum is kept as exp_avg; its matrices have no second moment (zeros in checkpoints).
inline bool has_moments(OptimizerKind kind) { return kind != OptimizerKind::sgd; }

}  // namespace fsdp
