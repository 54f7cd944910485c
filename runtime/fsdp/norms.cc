// ShardedModel: the gradient norm and the per-parameter sums of squares, one algorithm for
// every layout, and the grad sync hooks they consult (grad_sync_hook.h).
#include <cmath>
#include <utility>

#include "kernels/block_reduce.h"
#include "kernels/ops.h"
#include "runtime/fsdp/sharded_model.h"

namespace fsdp {
namespace {

// Sets of groups in the order the units first name them: every rank lists them alike, so
// the collectives over them are issued in the same order everywhere (pointer order would
// differ between processes).
template <typename Key>
size_t index_of(std::vector<Key>& keys, const Key& key) {
  for (size_t i = 0; i < keys.size(); ++i)
    if (keys[i] == key) return i;
  keys.push_back(key);
  return keys.size() - 1;
}

}  // namespace

void ShardedModel::add_grad_sync_hook(std::unique_ptr<GradSyncHook> hook) {
  FSDP_CHECK(hook != nullptr, ValueError, "add_grad_sync_hook: no hook");
  grad_sync_hooks_.push_back(std::move(hook));
}

UnitGradients ShardedModel::unit_gradients(int u, const Tensor& shard) const {
  const FsdpUnit& un = unit(u);
  return UnitGradients{un.plan(), un.params(), un.segments(), shard};
}

std::vector<Communicator*> ShardedModel::split_groups(int u) const {
  std::vector<Communicator*> groups;
  for (const auto& hook : grad_sync_hooks_) hook->split_groups(unit(u).plan(), &groups);
  return groups;
}

Tensor ShardedModel::counted(int u, const Tensor& shard) {
  std::vector<ShardRun> runs;
  for (const auto& hook : grad_sync_hooks_) hook->uncounted(unit_gradients(u, shard), &runs);
  if (runs.empty()) return shard;
  Context& ctx = shared_.ctx;
  Tensor out = ops::clone(ctx, shard);
  for (const ShardRun& r : runs) ops::fill(ctx, out.narrow(0, r.offset, r.numel), 0.0);
  return out;
}

std::vector<Tensor> ShardedModel::gather_block_sums(const std::vector<Tensor>& partials) {
  // Units by shard group; one all-gather of each group's units' partials, packed.
  Context& ctx = shared_.ctx;
  const int n_units = num_units();
  std::vector<Communicator*> gather_groups;
  std::vector<std::vector<int>> members;
  for (int u = 0; u < n_units; ++u) {
    Communicator* g = unit(u).groups().shard_gather;
    const size_t k = index_of(gather_groups, shared_.communicates(g) ? g : nullptr);
    if (k == members.size()) members.emplace_back();
    members[k].push_back(u);
  }
  std::vector<Tensor> per_rank(static_cast<size_t>(n_units));  // (ranks, blocks) of each unit
  for (size_t k = 0; k < gather_groups.size(); ++k) {
    Communicator* g = gather_groups[k];
    if (!g) {
      for (int u : members[k]) per_rank[size_t(u)] = partials[size_t(u)].view(Shape{1, partials[size_t(u)].numel()});
      continue;
    }
    int64_t total = 0;
    for (int u : members[k]) total += partials[size_t(u)].numel();
    const DType dt = partials[size_t(members[k].front())].dtype();
    Tensor packed = ctx.empty(Shape{total}, dt);
    int64_t at = 0;
    for (int u : members[k]) {
      ops::copy(ctx, packed.narrow(0, at, partials[size_t(u)].numel()), partials[size_t(u)]);
      at += partials[size_t(u)].numel();
    }
    Tensor all = ctx.empty(Shape{int64_t(g->size()) * total}, dt);
    shared_.calls.all_gather(*g, all, packed, ctx.stream());
    const Tensor rows = all.view(Shape{int64_t(g->size()), total});
    at = 0;
    for (int u : members[k]) {
      per_rank[size_t(u)] = rows.narrow(1, at, partials[size_t(u)].numel());
      at += partials[size_t(u)].numel();
    }
  }
  return per_rank;
}

void ShardedModel::sum_over_split_groups(const Tensor& totals) {
  // The units sharing a list of groups, packed, one all-reduce each.
  Context& ctx = shared_.ctx;
  std::vector<std::vector<Communicator*>> group_lists;
  std::vector<std::vector<int>> sharing;
  for (int u = 0; u < num_units(); ++u) {
    std::vector<Communicator*> groups;
    for (Communicator* c : split_groups(u))
      if (shared_.communicates(c)) groups.push_back(c);
    if (groups.empty()) continue;
    const size_t k = index_of(group_lists, groups);
    if (k == sharing.size()) sharing.emplace_back();
    sharing[k].push_back(u);
  }
  for (size_t k = 0; k < group_lists.size(); ++k) {
    Tensor packed = ctx.empty(Shape{int64_t(sharing[k].size())}, DType::f64);
    for (size_t i = 0; i < sharing[k].size(); ++i)
      ops::copy(ctx, packed.narrow(0, int64_t(i), 1), totals.narrow(0, sharing[k][i], 1));
    for (Communicator* c : group_lists[k])
      shared_.calls.all_reduce(*c, packed, ReduceOp::Sum, ctx.stream(), 1.0);
    for (size_t i = 0; i < sharing[k].size(); ++i)
      ops::copy(ctx, totals.narrow(0, sharing[k][i], 1), packed.narrow(0, int64_t(i), 1));
  }
}

double ShardedModel::grad_norm() {
  // Per unit, the sums of squares of fixed-size blocks of the elements this rank counts,
  // gathered over the unit's shard group in rank order (one all-gather per group, for all
  // its units), and summed per unit; each unit's total is then summed over its split
  // groups (the ranks holding its parameters' other parts). The totals come back in one
  // transfer and are added on the host in unit order. The blocks are the same for any
  // number of shards, so without split groups the norm has the same bits for every
  // data-parallel layout.
  Context& ctx = shared_.ctx;
  const int64_t block = shared_.options.shard_block;
  const int n_units = num_units();
  std::vector<Tensor> partials(static_cast<size_t>(n_units));
  for (int u = 0; u < n_units; ++u)
    partials[size_t(u)] = ops::block_sum_squares(ctx, counted(u, unit(u).grad_shard), block);
  const std::vector<Tensor> per_rank = gather_block_sums(partials);
  // Each unit's total, its blocks added in f64: f32 block sums add exactly there unless
  // their magnitudes span more than 2^29, so a unit's total is the same however its blocks
  // are split among ranks (or its parameters among units, as part units split them).
  Tensor totals = ctx.empty(Shape{n_units}, DType::f64);
  for (int u = 0; u < n_units; ++u) {
    const Tensor& blocks = per_rank[size_t(u)];
    ops::copy(ctx, totals.narrow(0, u, 1),
              ops::sum(ctx, blocks.dtype() == DType::f64 ? blocks : ops::cast(ctx, blocks, DType::f64)));
  }
  sum_over_split_groups(totals);
  double sum = 0;
  for (double v : ops::to_vector<double>(ctx, totals)) sum += v;
  return std::sqrt(sum) * grad_multiplier();
}

std::vector<double> ShardedModel::param_sums_of_squares(const std::vector<Tensor>& shards) {
  Context& ctx = shared_.ctx;
  FSDP_CHECK(shards.size() == units_.size(), ValueError, "param_sums_of_squares: ",
             shards.size(), " shards for ", units_.size(), " units");
  int64_t n_params = 0;
  for (const auto& up : units_) n_params += int64_t(up->plan().params.size());
  // Per parameter, its counted pieces in this rank's shard summed on the device, into one
  // vector per set of groups the units are summed over (their shard group, then their split
  // groups); one all-reduce per group of each vector, the vectors added (each parameter is
  // in one of them), and one read-back.
  std::vector<std::vector<Communicator*>> group_lists;
  std::vector<Tensor> sums;
  int64_t first = 0;  // the unit's first parameter in plan order
  for (int u = 0; u < num_units(); ++u) {
    const FsdpUnit& un = unit(u);
    std::vector<Communicator*> groups;
    if (shared_.communicates(un.groups().shard_gather)) groups.push_back(un.groups().shard_gather);
    for (Communicator* c : split_groups(u))
      if (shared_.communicates(c)) groups.push_back(c);
    const size_t k = index_of(group_lists, groups);
    if (k == sums.size()) sums.push_back(ops::zeros(ctx, Shape{n_params}, DType::f64));
    const Tensor shard = counted(u, shards[size_t(u)]);
    for (const ShardSegment& s : un.segments())
      ops::axpby(ctx, sums[k].narrow(0, first + s.param, 1), 1.0,
                 ops::sum_squares(ctx, shard.narrow(0, s.shard_offset, s.numel)));
    first += int64_t(un.params().size());
  }
  for (size_t k = 0; k < sums.size(); ++k)
    for (Communicator* c : group_lists[k])
      shared_.calls.all_reduce(*c, sums[k], ReduceOp::Sum, ctx.stream(), 1.0);
  Tensor total = sums.empty() ? ops::zeros(ctx, Shape{n_params}, DType::f64) : sums.front();
  for (size_t k = 1; k < sums.size(); ++k) ops::add(ctx, total, total, sums[k]);
  return ops::to_vector<double>(ctx, total);
}

}  // namespace fsdp
