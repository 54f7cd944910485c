#include "runtime/fsdp/buffer_layout.h"

#include <algorithm>

#include "collectives/comm_memory.h"
#include "runtime/core/allocator.h"

namespace fsdp {

int gather_pool_slots(const FsdpOptions& options) { return options.prefetch_units + 2; }

int grad_pool_slots(const FsdpOptions& options, int64_t max_block_numel) {
  const size_t slot_bytes = std::max<size_t>(1, size_t(max_block_numel) * dtype_size(options.grad_dtype));
  const size_t by_budget = size_t(std::max<int64_t>(options.max_inflight_reduce_bytes, 0)) / slot_bytes;
  return int(std::clamp<size_t>(by_budget, 2, 8));
}

int64_t gathered_numel(const UnitPlan& unit, DType compute_dtype) {
  if (!unit.encoded()) return unit.padded_numel;
  const int64_t size = int64_t(dtype_size(compute_dtype));
  return (unit.padded_numel * unit.wire_element_size + size - 1) / size;
}

int64_t block_slot_numel(const ShardingPlan& plan, DType compute_dtype, bool weights) {
  // Every unit but the root (the last) is a block's or, right after it, a companion of it.
  const std::vector<UnitPlan>& units = plan.units();
  int64_t most = 0, slot = 0;
  for (size_t i = 0; i + 1 < units.size(); ++i) {
    const UnitPlan& u = units[i];
    if (!u.companion()) slot = 0;
    slot += weights ? gathered_numel(u, compute_dtype) : u.padded_numel;
    most = std::max(most, slot);
  }
  return most;
}

ReduceStaging reduce_staging(const ShardingPlan& plan, const FsdpOptions& options) {
  ReduceStaging r;
  for (const UnitPlan& u : plan.units()) {
    r.out_numel = std::max(r.out_numel, u.shard_numel);
    if (options.grad_dtype != options.reduce_dtype) r.in_numel = std::max(r.in_numel, u.padded_numel);
  }
  return r;
}

size_t buffer_cost(int64_t n, DType dtype, bool registrable) {
  const size_t bytes = size_t(std::max<int64_t>(n, 1)) * dtype_size(dtype);
  return registrable ? registrable_bytes(bytes) : allocation_size_class(bytes);
}

PersistentLayout persistent_layout(const ShardingPlan& plan, const FsdpOptions& o) {
  const ShardingStrategy s = plan.strategy();
  const bool zero3 = s == ShardingStrategy::OptimGradsParams;
  const bool grads_sharded = zero3 || s == ShardingStrategy::OptimGrads;
  PersistentLayout l;
  for (const UnitPlan& u : plan.units()) {
    l.main.add(u.shard_numel);
    l.compute.add(zero3 ? u.shard_numel : u.padded_numel);
    l.grad_accum.add(grads_sharded ? u.shard_numel : u.padded_numel);
    if (!grads_sharded && o.grad_dtype != o.reduce_dtype)
      l.grad_full.add(u.padded_numel);
    else
      l.grad_full.skip();
    if (s == ShardingStrategy::Optim)
      l.grad_shard.add(u.shard_numel);
    else
      l.grad_shard.skip();
    if (zero3 && u.encoded())
      l.wire.add(u.shard_numel * u.wire_element_size);
    else
      l.wire.skip();
  }
  return l;
}

}  // namespace fsdp
