#include "runtime/optim/muon.h"

#include <algorithm>

#include "runtime/core/arena.h"

namespace fsdp {

MuonOrthogonalizer::MuonOrthogonalizer(Context& ctx, CollectiveCalls& calls,
                                       std::vector<MuonUnit> units, std::vector<MuonGroup> groups,
                                       DType dtype, const MuonOptions& options)
    : ctx_(ctx), calls_(calls), units_(std::move(units)), groups_(std::move(groups)), dtype_(dtype),
      options_(options) {
  FSDP_CHECK(groups_.size() == units_.size(), ValueError, "muon: ", groups_.size(), " groups for ",
             units_.size(), " units");
  // Refused here, before the first step, rather than by the kernel in it.
  FSDP_CHECK(!(ctx.is_cuda() && dtype == DType::f64), ConfigError,
             "optimizer.optimizer \"muon\" with optimizer.moments_dtype \"f64\" runs on the CPU "
             "only (Newton-Schulz runs in bf16 on a GPU): set optimizer.moments_dtype to f32 or "
             "bf16, or dist.device to cpu");
  int64_t largest = 0;
  for (size_t i = 0; i < units_.size(); ++i) {
    const MuonUnitGeometry& g = units_[i].geometry;
    if (g.shard_size > 1) {
      FSDP_CHECK(groups_[i].gather && groups_[i].reduce, ValueError, "muon: unit ", g.name,
                 " is sharded over ", g.shard_size, " ranks but has no group");
      largest = std::max(largest, g.padded_numel);
    }
  }
  if (largest > 0) {
    full_update_ = ops::zeros(ctx, Shape{largest}, dtype);
    full_out_ = ops::zeros(ctx, Shape{largest}, dtype);
    buffer_bytes_ = 2 * allocation_size_class(full_update_.nbytes());
  }
}

void MuonOrthogonalizer::orthogonalize_item(const MuonItem& item, const Tensor& update,
                                            const Tensor& out) {
  // The whole parameter: this rank's elements, or assembled over its tensor-parallel group.
  Tensor whole_update = update, whole_out = out;
  if (item.whole) {
    const Shape shape = item.whole->whole_shape();
    whole_update = ops::empty(ctx_, shape, dtype_);
    whole_out = ops::empty(ctx_, shape, dtype_);
    item.whole->assemble(ctx_, calls_, update.view(item.local_shape), whole_update);
  }
  const Tensor flat_update = whole_update.flatten(), flat_out = whole_out.flatten();
  // Consecutive matrices of one shape (k and v, gate and up, the experts) in one batched call.
  const std::vector<MuonMatrix>& ms = item.matrices;
  for (size_t i = 0; i < ms.size();) {
    const MuonMatrix& m = ms[i];
    const int64_t size = m.rows * m.cols;
    size_t n = 1;
    while (i + n < ms.size() && ms[i + n].rows == m.rows && ms[i + n].cols == m.cols &&
           ms[i + n].first == m.first + int64_t(n) * size)
      ++n;
    const Shape shape{int64_t(n), m.rows, m.cols};
    const Tensor o = flat_out.narrow(0, m.first, int64_t(n) * size).view(shape);
    ops::newton_schulz(ctx_, flat_update.narrow(0, m.first, int64_t(n) * size).view(shape), o,
                       options_.newton_schulz);
    ops::scale(ctx_, o, o, muon_scale(options_.scale, m.rows, m.cols));
    i += n;
  }
  if (item.whole) item.whole->slice(ctx_, whole_out, out.view(item.local_shape));
}

void MuonOrthogonalizer::orthogonalize(size_t i, const Tensor& update_shard, const Tensor& out_shard) {
  const MuonUnit& mu = units_.at(i);
  const MuonUnitGeometry& p = mu.geometry;
  const MuonGroup& g = groups_[i];
  const bool exchange = p.shard_size > 1;
  Tensor update = update_shard, out = out_shard;
  if (exchange) {
    update = full_update_.narrow(0, 0, p.padded_numel);
    out = full_out_.narrow(0, 0, p.padded_numel);
    if (calls_.communicates(g.gather)) calls_.all_gather(*g.gather, update, update_shard, ctx_.stream());
    ops::fill(ctx_, out, 0.0);
  }
  for (const MuonItem& item : mu.items) {
    if (exchange && item.owner != p.shard_rank) continue;
    const int64_t n = item.local_shape.numel();
    // Unsharded: the shard is the whole buffer (shard_begin() is 0).
    orthogonalize_item(item, update.narrow(0, item.offset, n), out.narrow(0, item.offset, n));
  }
  if (exchange) {
    if (calls_.communicates(g.reduce))
      calls_.reduce_scatter(*g.reduce, out_shard, out, ReduceOp::Sum, ctx_.stream(), 1.0);
  }
}

}  // namespace fsdp
