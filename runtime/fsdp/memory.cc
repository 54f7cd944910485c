#include "runtime/fsdp/memory.h"

#include <algorithm>
#include <set>

#include "collectives/comm_memory.h"
#include "runtime/core/allocator.h"
#include "runtime/core/error.h"

namespace fsdp {

std::vector<std::vector<nn::Module*>> unit_module_groups(nn::Module& model,
                                                         const std::string& unit_kind,
                                                         int per_unit) {
  FSDP_CHECK(per_unit >= 1, ConfigError, "blocks per FSDP unit must be at least 1, got ", per_unit);
  std::vector<std::vector<nn::Module*>> groups;
  for (nn::Module* m : model.modules_of_kind(unit_kind)) {
    FSDP_CHECK(m != &model, ConfigError, "the root module cannot be a unit of kind '", unit_kind, "'");
    if (groups.empty() || int(groups.back().size()) == per_unit) groups.emplace_back();
    groups.back().push_back(m);
  }
  return groups;
}

std::string unit_group_name(const std::vector<nn::Module*>& group) {
  if (group.size() == 1) return group.front()->name();
  return group.front()->name() + ".." + group.back()->name();
}

std::vector<std::pair<std::string, std::vector<ParamSpec>>> unit_specs(nn::Module& model,
                                                                       const std::string& unit_kind,
                                                                       int per_unit) {
  std::vector<std::pair<std::string, std::vector<ParamSpec>>> specs;
  std::set<nn::Parameter*> in_blocks;
  for (const std::vector<nn::Module*>& group : unit_module_groups(model, unit_kind, per_unit)) {
    std::vector<ParamSpec> ps;
    for (nn::Module* m : group)
      for (nn::Parameter* p : m->named_parameters()) {
        FSDP_CHECK(in_blocks.insert(p).second, ConfigError, "parameter '", p->name(),
                   "' is shared between two units; shared parameters must live in the root unit");
        ps.push_back({p->name(), p->shape(), p->weight_decay()});
      }
    specs.emplace_back(unit_group_name(group), std::move(ps));
  }
  std::vector<ParamSpec> root;
  for (nn::Parameter* p : model.named_parameters())
    if (!in_blocks.count(p)) root.push_back({p->name(), p->shape(), p->weight_decay()});
  specs.emplace_back("root", std::move(root));
  return specs;
}

int gather_pool_slots(const FsdpOptions& options) { return options.prefetch_units + 2; }

int grad_pool_slots(const FsdpOptions& options, int64_t max_block_numel) {
  const size_t slot_bytes = std::max<size_t>(1, size_t(max_block_numel) * dtype_size(options.grad_dtype));
  const size_t by_budget = size_t(std::max<int64_t>(options.max_inflight_reduce_bytes, 0)) / slot_bytes;
  return int(std::clamp<size_t>(by_budget, 2, 8));
}

ReduceStaging reduce_staging(const ShardingPlan& plan, const FsdpOptions& options) {
  ReduceStaging r;
  for (const UnitPlan& u : plan.units()) {
    r.out_numel = std::max(r.out_numel, u.shard_numel);
    if (options.grad_dtype != options.reduce_dtype) r.in_numel = std::max(r.in_numel, u.padded_numel);
  }
  return r;
}

namespace {

// What one buffer of n elements of `dtype` costs: the allocator's size class of its bytes,
// or, for registrable memory (nccl_ub), whole allocation granules.
size_t cost(int64_t n, DType dtype, bool registrable = false) {
  const size_t bytes = size_t(std::max<int64_t>(n, 1)) * dtype_size(dtype);
  return registrable ? registrable_bytes(bytes) : allocation_size_class(bytes);
}

}  // namespace

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
  }
  return l;
}

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
    return a.empty() ? 0 : cost(a.numel, dtype, registrable);
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
  if (zero3) b.gather_pool += cost(root.padded_numel, o.compute_dtype, ub);
  if (grads_sharded) b.grad_pool += cost(root.padded_numel, o.grad_dtype, ub);
  int64_t max_block = 0;
  for (size_t i = 0; i + 1 < plan.units().size(); ++i)
    max_block = std::max(max_block, plan.units()[i].padded_numel);
  if (plan.units().size() > 1) {
    if (zero3) b.gather_pool += size_t(gather_pool_slots(o)) * cost(max_block, o.compute_dtype, ub);
    if (grads_sharded)
      b.grad_pool += size_t(grad_pool_slots(o, max_block)) * cost(max_block, o.grad_dtype, ub);
  }
  if (ub && grads_sharded) {
    const ReduceStaging staging = reduce_staging(plan, o);
    b.grad_pool += cost(staging.out_numel, o.reduce_dtype, true);
    if (staging.in_numel > 0) b.grad_pool += cost(staging.in_numel, o.reduce_dtype, true);
  }
  return b;
}

size_t optimizer_state_bytes(const ShardingPlan& plan, const std::string& optimizer,
                             DType moments_dtype, int rank) {
  if (optimizer != "adamw") return 0;
  // Each moment is one arena over the weight-decay ranges of every unit's shard (see
  // runtime/optim/optimizer.cc, which lays them out the same way).
  ArenaLayout moments;
  for (const UnitPlan& u : plan.units())
    for (const DecayRange& r : u.decay_ranges(rank)) moments.add(r.numel);
  return moments.empty() ? 0 : 2 * cost(moments.numel, moments_dtype);
}

}  // namespace fsdp
