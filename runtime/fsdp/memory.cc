#include "runtime/fsdp/memory.h"

#include <algorithm>
#include <set>

#include "runtime/core/error.h"

namespace fsdp {

std::vector<std::pair<std::string, std::vector<ParamSpec>>> unit_specs(nn::Module& model,
                                                                       const std::string& unit_kind) {
  std::vector<std::pair<std::string, std::vector<ParamSpec>>> specs;
  std::set<nn::Parameter*> in_blocks;
  for (nn::Module* m : model.modules_of_kind(unit_kind)) {
    FSDP_CHECK(m != &model, ConfigError, "the root module cannot be a unit of kind '", unit_kind, "'");
    std::vector<ParamSpec> ps;
    for (nn::Parameter* p : m->named_parameters()) {
      FSDP_CHECK(in_blocks.insert(p).second, ConfigError, "parameter '", p->name(),
                 "' is shared between two units; shared parameters must live in the root unit");
      ps.push_back({p->name(), p->shape(), p->weight_decay()});
    }
    specs.emplace_back(m->name(), std::move(ps));
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

MemoryBreakdown estimate_memory(const ShardingPlan& plan, const FsdpOptions& o) {
  const ShardingStrategy s = plan.strategy();
  const bool zero3 = s == ShardingStrategy::OptimGradsParams;
  const bool grads_sharded = zero3 || s == ShardingStrategy::OptimGrads;
  const size_t c = dtype_size(o.compute_dtype), m = dtype_size(o.main_dtype),
               g = dtype_size(o.grad_dtype), r = dtype_size(o.reduce_dtype);
  MemoryBreakdown b;
  int64_t max_block = 0;
  const size_t n_units = plan.units().size();
  for (size_t i = 0; i < n_units; ++i) {
    const UnitPlan& u = plan.units()[i];
    const bool root = i + 1 == n_units;
    const size_t shard = size_t(u.shard_numel), full = size_t(u.padded_numel);
    if (!root) max_block = std::max(max_block, u.padded_numel);
    b.main_weights += shard * m;
    if (zero3) {
      b.compute_weights += shard * c;
      if (root) b.gather_pool += full * c;
    } else {
      b.compute_weights += full * c;
    }
    if (grads_sharded) {
      b.grad_accumulation += shard * r;
      if (root) b.grad_pool += full * g;
    } else {
      b.full_grads += full * r;
      if (o.grad_dtype != o.reduce_dtype) b.full_grads += full * g;
      if (s == ShardingStrategy::Optim) b.grad_accumulation += shard * r;
    }
  }
  if (n_units > 1) {
    if (zero3) b.gather_pool += size_t(gather_pool_slots(o)) * size_t(max_block) * c;
    if (grads_sharded) b.grad_pool += size_t(grad_pool_slots(o, max_block)) * size_t(max_block) * g;
  }
  return b;
}

size_t optimizer_state_bytes(const ShardingPlan& plan, const std::string& optimizer,
                             DType moments_dtype) {
  if (optimizer != "adamw") return 0;
  size_t n = 0;
  for (const UnitPlan& u : plan.units()) n += size_t(u.shard_numel);
  return 2 * n * dtype_size(moments_dtype);
}

}  // namespace fsdp
