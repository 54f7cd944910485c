// Memory of a sharded model per rank, computed from the plan alone (no allocation), so the
// same numbers serve the dry run, the start-up report and the check against what the
// ShardedModel actually allocates.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/arena.h"
#include "runtime/fsdp/plan.h"
#include "runtime/fsdp/sharded_model.h"
#include "runtime/nn/module.h"

namespace fsdp {

// The modules of kind `unit_kind` in forward order, grouped `per_unit` consecutive ones at a
// time (the last group may be shorter): each group is one unit, its collectives one bucket.
std::vector<std::vector<nn::Module*>> unit_module_groups(nn::Module& model,
                                                         const std::string& unit_kind,
                                                         int per_unit = 1);
// A group's unit name: the module's name, or "first..last" for several.
std::string unit_group_name(const std::vector<nn::Module*>& group);

// The units of `model` as fully_shard() forms them: one per group of `per_unit` modules of
// kind `unit_kind` in forward order (named by unit_group_name), then "root" with every other
// parameter (a parameter shared by several modules appears once, in the root).
std::vector<std::pair<std::string, std::vector<ParamSpec>>> unit_specs(nn::Module& model,
                                                                       const std::string& unit_kind,
                                                                       int per_unit = 1);

// The persistent buffers of a sharded model, one arena per class (see sharded_model.h's
// table); offsets[u] is unit u's buffer, -1 when it has none in that class.
struct PersistentLayout {
  ArenaLayout main;        // master weights, this rank's shard of each unit
  ArenaLayout compute;     // compute weights: shards (ZeRO-3) or full buffers
  ArenaLayout grad_accum;  // accumulated gradients: shards (ZeRO-2/3) or full buffers
  ArenaLayout grad_full;   // per-micro-batch full gradients when their dtype differs (no_shard, optim)
  ArenaLayout grad_shard;  // ZeRO-1's reduce-scatter output
};
PersistentLayout persistent_layout(const ShardingPlan& plan, const FsdpOptions& options);

// Bytes per buffer class that a ShardedModel with `plan` and `options` allocates on one rank
// (the optimizer's moments are the optimizer's; see optimizer_state_bytes).
MemoryBreakdown estimate_memory(const ShardingPlan& plan, const FsdpOptions& options);

// Adam's two moments over `rank`'s main-weight elements (one pair per weight-decay range).
size_t optimizer_state_bytes(const ShardingPlan& plan, const std::string& optimizer,
                             DType moments_dtype, int rank = 0);

// nccl_ub with sharded gradients (ZeRO-2/3): elements of reduce_dtype in the persistent
// reduce-scatter output (the largest unit's shard) and input (the largest unit, when the
// gradients are cast to the reduce dtype before the reduction; else 0).
struct ReduceStaging {
  int64_t out_numel = 0;
  int64_t in_numel = 0;
};
ReduceStaging reduce_staging(const ShardingPlan& plan, const FsdpOptions& options);

// Slots of the two buffer pools for these options.
int gather_pool_slots(const FsdpOptions& options);
int grad_pool_slots(const FsdpOptions& options, int64_t max_block_numel);

}  // namespace fsdp
