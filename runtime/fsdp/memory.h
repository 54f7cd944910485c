// Memory of a sharded model per rank, computed from the plan alone (no allocation), so the
// same numbers serve the dry run, the start-up report and the check against what the
// ShardedModel actually allocates.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "runtime/fsdp/plan.h"
#include "runtime/fsdp/sharded_model.h"
#include "runtime/nn/module.h"

namespace fsdp {

// The units of `model` as fully_shard() forms them: one per module of kind `unit_kind` in
// forward order (named by module), then "root" with every other parameter (a parameter shared
// by several modules appears once, in the root).
std::vector<std::pair<std::string, std::vector<ParamSpec>>> unit_specs(nn::Module& model,
                                                                       const std::string& unit_kind);

// Bytes per buffer class that a ShardedModel with `plan` and `options` allocates on one rank
// (the optimizer's moments are the optimizer's; see optimizer_state_bytes).
MemoryBreakdown estimate_memory(const ShardingPlan& plan, const FsdpOptions& options);

// Adam's two moments over this rank's main-weight elements.
size_t optimizer_state_bytes(const ShardingPlan& plan, const std::string& optimizer,
                             DType moments_dtype);

// Slots of the two buffer pools for these options.
int gather_pool_slots(const FsdpOptions& options);
int grad_pool_slots(const FsdpOptions& options, int64_t max_block_numel);

}  // namespace fsdp
