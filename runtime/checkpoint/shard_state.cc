#include "runtime/checkpoint/shard_state.h"

#include "kernels/ops.h"
#include "runtime/checkpoint/metadata.h"

namespace fsdp::checkpoint {

ShardState::ShardState(const ShardedModel& model, const Optimizer* optimizer)
    : optimizer_(optimizer) {
  const int n = model.num_units();
  pieces_.resize(size_t(n));
  for (int u = 0; u < n; ++u) main_.push_back(model.main_shard(u));
  if (!optimizer) return;
  // Each optimizer range is a view into exactly one unit's master-weight shard.
  const std::vector<OptimizerRange>& ranges = optimizer->ranges();
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Tensor& m = ranges[i].main;
    // The units' shards may be views into one allocation: the owner is the unit whose shard
    // contains the range.
    int owner = -1;
    for (int u = 0; u < n && owner < 0; ++u) {
      const Tensor& shard = main_[size_t(u)];
      if (m.shares_storage(shard) && m.offset() >= shard.offset() &&
          m.offset() + m.numel() <= shard.offset() + shard.numel())
        owner = u;
    }
    FSDP_ASSERT(owner >= 0, "optimizer range ", ranges[i].name,
                " is not a view of any unit's master weights (was the optimizer built from "
                "this model's optimizer_ranges()?)");
    const Tensor& shard = main_[size_t(owner)];
    const int64_t offset = m.offset() - shard.offset();
    FSDP_ASSERT(m.is_contiguous() && offset >= 0 && offset + m.numel() <= shard.numel(),
                "optimizer range ", ranges[i].name, " lies outside its unit's shard");
    pieces_[size_t(owner)].push_back({i, offset, m.numel()});
  }
  // Together the ranges must cover each unit's shard (the moments of every element).
  for (int u = 0; u < n; ++u) {
    int64_t covered = 0;
    for (const Piece& p : pieces_[size_t(u)]) covered += p.numel;
    FSDP_ASSERT(covered == main_[size_t(u)].numel(), "the optimizer ranges of unit ", u,
                " cover ", covered, " of its ", main_[size_t(u)].numel(), " elements");
  }
}

std::vector<std::string> ShardState::kinds() const {
  if (optimizer_ && has_moments(optimizer_->config().kind)) return {kMainWeights, kExpAvg, kExpAvgSq};
  return {kMainWeights};
}

DType ShardState::dtype(const std::string& kind) const {
  if (kind == kMainWeights) return main_.empty() ? DType::f32 : main_.front().dtype();
  FSDP_ASSERT(optimizer_, "no optimizer state \"", kind, "\"");
  return optimizer_->config().moments_dtype;
}

int64_t ShardState::shard_numel(int unit) const { return main_.at(size_t(unit)).numel(); }

Tensor ShardState::to_host(Context& ctx, int unit, const std::string& kind) const {
  const Tensor& main = main_.at(size_t(unit));
  if (kind == kMainWeights) return ops::contiguous(ctx, ops::to_host(ctx, main));
  FSDP_ASSERT(optimizer_ && (kind == kExpAvg || kind == kExpAvgSq), "unknown state \"", kind, "\"");
  Tensor host = ctx.empty_host(Shape{main.numel()}, dtype(kind));
  for (const Piece& p : pieces_[size_t(unit)]) {
    const Tensor& m = kind == kExpAvg ? optimizer_->exp_avg(p.range) : optimizer_->exp_avg_sq(p.range);
    const Tensor into = host.narrow(0, p.shard_offset, p.numel);
    // Muon's matrices keep no second moment: zeros.
    if (m.defined())
      ops::copy(ctx, into, m.flatten());
    else
      ops::fill(ctx, into, 0.0);
  }
  return host;
}

void ShardState::from_host(Context& ctx, int unit, const std::string& kind, const Tensor& host) const {
  const Tensor& main = main_.at(size_t(unit));
  FSDP_ASSERT(host.numel() == main.numel(), "unit ", unit, ": ", host.numel(),
              " elements for a shard of ", main.numel());
  const Tensor flat = host.flatten();
  if (kind == kMainWeights) {
    ops::copy(ctx, main, flat);
    return;
  }
  FSDP_ASSERT(optimizer_ && (kind == kExpAvg || kind == kExpAvgSq), "unknown state \"", kind, "\"");
  for (const Piece& p : pieces_[size_t(unit)]) {
    const Tensor& m = kind == kExpAvg ? optimizer_->exp_avg(p.range) : optimizer_->exp_avg_sq(p.range);
    if (m.defined()) ops::copy(ctx, m.flatten(), flat.narrow(0, p.shard_offset, p.numel));
  }
}

}  // namespace fsdp::checkpoint
