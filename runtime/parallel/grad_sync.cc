#include "runtime/parallel/grad_sync.h"

#include <set>

#include "kernels/ops.h"

namespace fsdp {
namespace {

// Runs of one tensor packed end to end into a new one, and back.
Tensor pack(Context& ctx, const Tensor& t, const std::vector<ShardRun>& runs, int64_t total) {
  Tensor out = ctx.empty(Shape{total}, t.dtype());
  int64_t at = 0;
  for (const ShardRun& r : runs) {
    ops::copy(ctx, out.narrow(0, at, r.numel), t.narrow(0, r.offset, r.numel));
    at += r.numel;
  }
  return out;
}

void unpack(Context& ctx, const Tensor& t, const std::vector<ShardRun>& runs, const Tensor& packed) {
  int64_t at = 0;
  for (const ShardRun& r : runs) {
    ops::copy(ctx, t.narrow(0, r.offset, r.numel), packed.narrow(0, at, r.numel));
    at += r.numel;
  }
}

// The tensor-parallel slice a parameter's rows follow, or null (an expert's slice is over
// the expert-parallel group: every tensor-parallel rank holds it whole).
const nn::ParallelSlice* tensor_parallel_slice(const nn::Parameter& p) {
  const nn::Placement& placement = p.placement();
  return placement.slice && placement.split_over == nn::Placement::SplitOver::tensor_parallel
             ? &*placement.slice
             : nullptr;
}

}  // namespace

void TensorParallelGradSync::after_reduction(const UnitGradients& unit, CollectiveCalls& calls,
                                             Context& ctx) {
  // Both reductions are sums, so the data-parallel one (done) and this one commute.
  if (!calls.communicates(group_)) return;
  std::vector<ShardRun> summed;
  struct Replicated {
    ShardRun run;
    int replicas;
  };
  std::vector<Replicated> replicated;
  int64_t summed_numel = 0, replicated_numel = 0;
  for (const ShardSegment& s : unit.segments) {
    const nn::Parameter& p = *unit.params[size_t(s.param)];
    if (p.placement().partial_grad) {
      summed.push_back({s.shard_offset, s.numel});
      summed_numel += s.numel;
      continue;
    }
    const nn::ParallelSlice* slice = tensor_parallel_slice(p);
    if (!slice || slice->replicas.empty()) continue;  // (most slices replicate nothing)
    for (const nn::ParallelSlice::Run& run : slice->runs(s.param_offset, s.numel)) {
      if (run.replicas == 1) continue;
      replicated.push_back({{s.shard_offset + (run.local - s.param_offset), run.numel}, run.replicas});
      replicated_numel += run.numel;
    }
  }
  const Tensor& g = unit.grad_shard;
  if (summed.size() == 1) {
    calls.all_reduce(*group_, g.narrow(0, summed[0].offset, summed[0].numel), ReduceOp::Sum,
                     ctx.stream(), 1.0);
  } else if (!summed.empty()) {
    const Tensor packed = pack(ctx, g, summed, summed_numel);
    calls.all_reduce(*group_, packed, ReduceOp::Sum, ctx.stream(), 1.0);
    unpack(ctx, g, summed, packed);
  }
  if (replicated.empty()) return;
  // Rows that `replicas` ranks hold: each computed a part of their gradient. Every rank of
  // the group holds these pieces alike, so they are all-gathered (packed, one collective)
  // and each block of replicas adds its own in rank order (the same bits on each of them).
  std::vector<ShardRun> runs;
  for (const Replicated& r : replicated) runs.push_back(r.run);
  const Tensor packed = pack(ctx, g, runs, replicated_numel);
  const Tensor all = ctx.empty(Shape{int64_t(group_->size()) * replicated_numel}, g.dtype());
  calls.all_gather(*group_, all, packed, ctx.stream());
  int64_t at = 0;
  for (const Replicated& r : replicated) {
    const Tensor piece = g.narrow(0, r.run.offset, r.run.numel);
    const int first = group_->rank() / r.replicas * r.replicas;
    ops::copy(ctx, piece, all.narrow(0, first * replicated_numel + at, r.run.numel));
    for (int k = 1; k < r.replicas; ++k)
      ops::add(ctx, piece, piece, all.narrow(0, (first + k) * replicated_numel + at, r.run.numel));
    at += r.run.numel;
  }
}

void TensorParallelGradSync::uncounted(const UnitGradients& unit, std::vector<ShardRun>* runs) const {
  if (!group_ || group_->size() == 1) return;
  const int rank = group_->rank();
  for (const ShardSegment& s : unit.segments) {
    const nn::ParallelSlice* slice = tensor_parallel_slice(*unit.params[size_t(s.param)]);
    // A parameter every rank holds whole counts on the first rank; a slice of which no rows
    // are shared counts everywhere; otherwise only the runs this rank owns count.
    if (!slice) {
      if (rank != 0) runs->push_back({s.shard_offset, s.numel});
      continue;
    }
    if (slice->replicas.empty()) continue;
    std::set<int64_t> owned;
    for (const nn::ParallelSlice::Run& r : slice->owned_runs(s.param_offset, s.numel, rank))
      owned.insert(r.local);
    for (const nn::ParallelSlice::Run& r : slice->runs(s.param_offset, s.numel))
      if (!owned.count(r.local))
        runs->push_back({s.shard_offset + (r.local - s.param_offset), r.numel});
  }
}

void TensorParallelGradSync::split_groups(const UnitPlan& unit, std::vector<Communicator*>* groups) const {
  (void)unit;
  groups->push_back(group_);
}

void ExpertParallelGradSync::after_reduction(const UnitGradients& unit, CollectiveCalls& calls,
                                             Context& ctx) {
  (void)calls;
  const int ep = group_ ? group_->size() : 1;
  if (ep == 1 || !unit.plan.part) return;
  ops::scale(ctx, unit.grad_shard, unit.grad_shard, 1.0 / ep);
}

void ExpertParallelGradSync::split_groups(const UnitPlan& unit, std::vector<Communicator*>* groups) const {
  if (unit.part) groups->push_back(group_);
}

}  // namespace fsdp
