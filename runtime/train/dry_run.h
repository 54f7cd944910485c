// The dry run: what a recipe would do, computed without touching a GPU or allocating the
// model (specs and the sharding plan only).
#pragma once

#include <string>

#include "runtime/train/recipe.h"

namespace fsdp::train {

// The resolved recipe, the parameter count, tokens per step, and the per-rank memory
// estimate for `world_size` ranks on a GPU (assume_cuda) or the CPU, and what the
// `ranks_per_device` that share one GPU (dist.backend=staged) hold together. Throws
// ConfigError for a recipe that cannot run with that world size.
std::string dry_run_report(Recipe recipe, int world_size, bool assume_cuda,
                           int ranks_per_device = 1);

}  // namespace fsdp::train
