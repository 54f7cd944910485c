// Where a sharded model's buffers lie: one arena per persistent buffer class, the sizes of
// the two buffer pools and of the registered reduce-scatter staging (nccl_ub), and what a
// buffer costs. Plain values from the plan and the options; the ShardedModel allocates
// from them and the memory estimate (memory.h) prices them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/core/arena.h"
#include "runtime/fsdp/options.h"
#include "runtime/fsdp/plan.h"

namespace fsdp {

// The persistent buffers of a sharded model, one arena per class (see sharded_model.h's
// table); offsets[u] is unit u's buffer, -1 when it has none in that class.
struct PersistentLayout {
  ArenaLayout main;        // master weights, this rank's shard of each unit
  ArenaLayout compute;     // compute weights: shards (ZeRO-3) or full buffers
  ArenaLayout grad_accum;  // accumulated gradients: shards (ZeRO-2/3) or full buffers
  ArenaLayout grad_full;   // per-micro-batch full gradients when their dtype differs (no_shard, optim)
  ArenaLayout grad_shard;  // ZeRO-1's reduce-scatter output
  ArenaLayout wire;        // ZeRO-3 encoded units: this rank's wire shard, in bytes
};
PersistentLayout persistent_layout(const ShardingPlan& plan, const FsdpOptions& options);

// Elements of one pool slot: the largest block's full buffer, with its companions' after it
// (a part or encoded unit is gathered and reduced with its block, in the same slot). For
// the gathered weights (`weights`) an encoded unit takes its wire bytes in elements of
// compute_dtype; for the gradients, its elements.
int64_t block_slot_numel(const ShardingPlan& plan, DType compute_dtype, bool weights);
// Elements of compute_dtype that a unit's gathered weights take (FsdpUnit::gathered_numel).
int64_t gathered_numel(const UnitPlan& unit, DType compute_dtype);

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

// What one buffer of n elements of `dtype` costs: the allocator's size class of its bytes,
// or, for registrable memory (nccl_ub), whole allocation granules (at least one element).
size_t buffer_cost(int64_t n, DType dtype, bool registrable = false);

}  // namespace fsdp
