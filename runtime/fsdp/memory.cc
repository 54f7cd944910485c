#include "runtime/fsdp/memory.h"

#include <algorithm>
#include <set>

#include "runtime/fsdp/buffer_layout.h"
#include "runtime/fsdp/gather_codec.h"

namespace fsdp {

MemoryBreakdown estimate_memory(const ShardingPlan& plan, const FsdpOptions& o) {
  const ShardingStrategy s = plan.strategy();
  const bool zero3 = s == ShardingStrategy::OptimGradsParams;
  const bool grads_sharded = zero3 || s == ShardingStrategy::OptimGrads;
  const PersistentLayout l = persistent_layout(plan, o);
  // nccl_ub: the shard group's collective buffers are registrable memory (see
  // ShardedModel::allocate).
  const bool ub = o.nccl_ub && plan.dp_size() > 1;
  const bool zero1 = s == ShardingStrategy::Optim;
  auto arena_cost = [](const ArenaLayout& a, DType dtype, bool registrable = false) {
    return a.empty() ? 0 : buffer_cost(a.numel, dtype, registrable);
  };
  MemoryBreakdown b;
  (o.offload_main ? b.host_main_weights : b.main_weights) = arena_cost(l.main, o.main_dtype);
  b.compute_weights = arena_cost(l.compute, o.compute_dtype, ub);
  if (grads_sharded) {
    b.grad_accumulation = arena_cost(l.grad_accum, o.reduce_dtype);
  } else {
    b.full_grads = arena_cost(l.grad_accum, o.reduce_dtype, ub && zero1) +
                   arena_cost(l.grad_full, o.grad_dtype);
    b.grad_accumulation = arena_cost(l.grad_shard, o.reduce_dtype, ub && zero1);
  }
  // The root's own full buffers (ZeRO-3 weights; ZeRO-2/3 gradients), then the pools.
  const UnitPlan& root = plan.units().back();
  if (zero3) b.gather_pool += buffer_cost(root.padded_numel, o.compute_dtype, ub);
  if (grads_sharded) b.grad_pool += buffer_cost(root.padded_numel, o.grad_dtype, ub);
  const int64_t max_gathered = block_slot_numel(plan, o.compute_dtype, true);
  const int64_t max_block = block_slot_numel(plan, o.compute_dtype, false);
  if (plan.units().size() > 1) {
    if (zero3) b.gather_pool += size_t(gather_pool_slots(o)) * buffer_cost(max_gathered, o.compute_dtype, ub);
    if (grads_sharded)
      b.grad_pool += size_t(grad_pool_slots(o, max_block)) * buffer_cost(max_block, o.grad_dtype, ub);
  }
  b.compute_weights += arena_cost(l.wire, DType::u8, ub);
  if (o.gather_codec) b.compute_weights += o.gather_codec->state_bytes(plan);
  if (ub && grads_sharded) {
    const ReduceStaging staging = reduce_staging(plan, o);
    b.grad_pool += buffer_cost(staging.out_numel, o.reduce_dtype, true);
    if (staging.in_numel > 0) b.grad_pool += buffer_cost(staging.in_numel, o.reduce_dtype, true);
  }
  return b;
}

size_t optimizer_state_bytes(const ShardingPlan& plan, OptimizerKind optimizer,
                             DType moments_dtype, int rank,
                             const std::vector<std::string>& muon_params) {
  if (!has_moments(optimizer)) return 0;
  // Each moment is one arena over the weight-decay ranges of every unit's shard (see
  // runtime/optim/optimizer.cc, which lays them out the same way).
  ArenaLayout moments;
  for (const UnitPlan& u : plan.units())
    for (const DecayRange& r : u.decay_ranges(rank)) moments.add(r.numel);
  if (moments.empty()) return 0;
  if (optimizer != OptimizerKind::muon) return 2 * buffer_cost(moments.numel, moments_dtype);
  // Muon: no second moment for its matrices; a shard-sized update and result, and, where a
  // unit is sharded, its gathered update and the owners' results (the largest block's).
  int64_t matrix = 0, shard = 0, padded = 0;
  const std::set<std::string> taken(muon_params.begin(), muon_params.end());
  for (const UnitPlan& u : plan.units()) {
    if (std::none_of(u.params.begin(), u.params.end(),
                     [&](const ParamPlacement& p) { return taken.count(p.name) > 0; }))
      continue;  // no Muon unit
    for (const ShardSegment& s : u.segments(rank))
      if (taken.count(u.params[size_t(s.param)].name) > 0) matrix += s.numel;
    shard = std::max(shard, u.shard_numel);
    if (u.dp_size > 1) padded = std::max(padded, u.padded_numel);
  }
  const DType exchange = moments_dtype == DType::f64 ? DType::f64 : DType::f32;
  size_t bytes = buffer_cost(moments.numel, moments_dtype) + buffer_cost(moments.numel - matrix, moments_dtype);
  if (shard > 0) bytes += 2 * buffer_cost(shard, exchange);
  if (padded > 0) bytes += 2 * buffer_cost(padded, exchange);
  return bytes;
}

}  // namespace fsdp
