// Memory of a sharded model per rank, computed from the plan alone (no allocation), so the
// same numbers serve the dry run, the start-up report and the check against what the
// ShardedModel actually allocates.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "runtime/fsdp/options.h"
#include "runtime/fsdp/plan.h"
#include "runtime/optim/optimizer_kind.h"

namespace fsdp {

// Bytes per buffer class that a ShardedModel with `plan` and `options` allocates on one rank
// (the optimizer's moments are the optimizer's; see optimizer_state_bytes).
MemoryBreakdown estimate_memory(const ShardingPlan& plan, const FsdpOptions& options);

// Adam's two moments over `rank`'s main-weight elements (one pair per weight-decay range).
// Muon: one moment for every element, a second for those not in `muon_params` (the
// parameters it takes), and its exchange buffers (runtime/optim/muon.h).
size_t optimizer_state_bytes(const ShardingPlan& plan, OptimizerKind optimizer,
                             DType moments_dtype, int rank = 0,
                             const std::vector<std::string>& muon_params = {});

}  // namespace fsdp
