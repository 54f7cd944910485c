#include "runtime/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/ops.h"
#include "runtime/core/arena.h"

namespace fsdp {

Optimizer::Optimizer(Context& ctx, std::vector<OptimizerRange> ranges, const OptimizerConfig& config,
                     std::unique_ptr<MuonOrthogonalizer> muon)
    : ctx_(ctx), ranges_(std::move(ranges)), config_(config) {
  FSDP_CHECK(config.moments_dtype == DType::f32 || config.moments_dtype == DType::bf16 ||
                 config.moments_dtype == DType::f64,
             ConfigError, "optimizer.moments_dtype must be f32, bf16 or f64");
  if (config.kind == OptimizerKind::muon) {
    FSDP_CHECK(muon != nullptr, ValueError, "optimizer: muon needs the layout of its matrices");
    muon_ = std::move(muon);
    split_for_muon();
  }
  ArenaLayout layout;
  size_t on_host = 0;
  for (const OptimizerRange& r : ranges_) {
    FSDP_CHECK(r.main.numel() == r.grad.numel(), ShapeError, "optimizer range ", r.name,
               ": ", r.main.numel(), " weights but ", r.grad.numel(), " gradients");
    layout.add(r.main.numel());
    on_host += r.main.device().is_cpu() ? 1 : 0;
  }
  const bool offload = (ctx.is_cuda() || config.offload_on_cpu) && on_host > 0;
  FSDP_CHECK(!offload || on_host == ranges_.size(), ValueError,
             "optimizer: some ranges' master weights are on the host and some on the device");
  FSDP_CHECK(!offload || config.kind == OptimizerKind::adamw, ConfigError,
             "optimizer.cpu_offload supports adamw only, not ", optimizer_kind_name(config.kind));
  if (has_moments(config.kind) && !layout.empty()) {
    // Each moment is one zeroed allocation; the ranges' moments are views into it. Muon's
    // matrix ranges have no second moment.
    for (auto* moments : {&exp_avg_, &exp_avg_sq_}) {
      const bool second = moments == &exp_avg_sq_;
      ArenaLayout held;
      for (const OptimizerRange& r : ranges_) held.add(second && r.matrix ? 0 : r.main.numel());
      Tensor arena;
      if (offload) {
        arena = ctx.empty_pinned(Shape{held.numel}, config.moments_dtype);
        std::memset(arena.data_ptr(), 0, arena.nbytes());
        host_bytes_ += allocation_size_class(arena.nbytes());
      } else {
        arena = ops::zeros(ctx, Shape{held.numel}, config.moments_dtype);
        arena_bytes_ += allocation_size_class(arena.nbytes());
      }
      for (size_t i = 0; i < ranges_.size(); ++i) {
        const OptimizerRange& r = ranges_[i];
        moments->push_back(second && r.matrix ? Tensor()
                                              : arena.narrow(0, held.offsets[i], r.main.numel()).view(r.main.shape()));
      }
    }
  }
  if (muon_) {
    int64_t largest = 0;
    for (const MuonUnit& mu : muon_->units()) largest = std::max(largest, mu.geometry.shard_numel);
    const DType dtype = config.moments_dtype == DType::f64 ? DType::f64 : DType::f32;
    muon_update_ = ops::zeros(ctx, Shape{largest}, dtype);
    muon_out_ = ops::zeros(ctx, Shape{largest}, dtype);
    arena_bytes_ += 2 * allocation_size_class(muon_update_.nbytes()) + muon_->buffer_bytes();
  }
  if (offload) {
    offload_ = std::make_unique<OffloadedAdamW>(ctx, ranges_, config.offload);
    host_bytes_ += offload_->staging_bytes() + offload_->snapshot_bytes();
  }
}

void Optimizer::step(double lr, double grad_scale) {
  ++step_;
  // AdamW's settings for this step; each range sets its own weight decay.
  ops::AdamWParams adam;
  adam.lr = lr;
  adam.beta1 = config_.beta1;
  adam.beta2 = config_.beta2;
  adam.eps = config_.eps;
  adam.step = step_;
  adam.grad_scale = grad_scale;
  if (offload_) {
    offload_->step(ranges_, exp_avg_, exp_avg_sq_, config_.weight_decay, adam);
    return;
  }
  if (muon_) {
    adam.lr = lr * config_.adamw_lr_ratio;
    muon_step(lr, grad_scale);
  }
  for (size_t i = 0; i < ranges_.size(); ++i) {
    const OptimizerRange& r = ranges_[i];
    if (r.main.numel() == 0 || r.matrix) continue;
    const double wd = r.weight_decay ? config_.weight_decay : 0.0;
    if (config_.kind != OptimizerKind::sgd) {
      ops::AdamWParams p = adam;
      p.weight_decay = wd;
      ops::adamw_step(ctx_, r.main, r.grad, exp_avg_[i], exp_avg_sq_[i], p, r.param_copy);
    } else {
      // SGD with decoupled decay: w <- (1 - lr wd) w - lr * scale * g.
      ops::axpby(ctx_, r.main, -lr * grad_scale, r.grad, 1.0 - lr * wd);
      if (r.param_copy.defined()) ops::copy(ctx_, r.param_copy, r.main);
    }
  }
}

void Optimizer::split_for_muon() {
  // The Muon unit (index in muon_->units()) of each plan unit, -1: none.
  std::vector<int> of_unit;
  for (size_t i = 0; i < muon_->units().size(); ++i) {
    const int u = muon_->units()[i].unit;
    if (int(of_unit.size()) <= u) of_unit.resize(size_t(u) + 1, -1);
    of_unit[size_t(u)] = int(i);
  }
  std::vector<OptimizerRange> split;
  muon_ranges_.assign(muon_->units().size(), {});
  for (const OptimizerRange& r : ranges_) {
    const int m = r.unit >= 0 && r.unit < int(of_unit.size()) ? of_unit[size_t(r.unit)] : -1;
    if (m < 0) {
      split.push_back(r);
      continue;
    }
    FSDP_CHECK(r.main.dim() == 1, ShapeError, "optimizer range ", r.name, " is not flat");
    const MuonUnit& mu = muon_->units()[size_t(m)];
    const MuonUnitGeometry& p = mu.geometry;
    const int64_t begin = r.shard_offset, end = r.shard_offset + r.main.numel();
    // [begin, end) cut at the Muon pieces inside it.
    auto add = [&](int64_t b, int64_t e, bool matrix) {
      if (b >= e) return;
      OptimizerRange piece = r;
      const int64_t at = p.shard_begin();
      piece.name = str_cat(p.name, "[", at + b, ":", at + e, "]", matrix ? " muon" : "");
      piece.main = r.main.narrow(0, b - begin, e - b);
      piece.grad = r.grad.narrow(0, b - begin, e - b);
      if (r.param_copy.defined()) piece.param_copy = r.param_copy.narrow(0, b - begin, e - b);
      piece.shard_offset = b;
      piece.matrix = matrix;
      if (matrix) muon_ranges_[size_t(m)].push_back(split.size());
      split.push_back(piece);
    };
    int64_t at = begin;
    for (const ShardPiece& piece : muon_shard_pieces(mu)) {
      const int64_t b = std::max(begin, piece.shard_offset), e = std::min(end, piece.shard_offset + piece.numel);
      if (b >= e) continue;
      add(at, b, false);
      add(b, e, true);
      at = e;
    }
    add(at, end, false);
  }
  ranges_ = std::move(split);
}

void Optimizer::muon_step(double lr, double grad_scale) {
  const MuonOptions& o = config_.muon;
  const double beta = o.momentum;
  for (size_t m = 0; m < muon_->units().size(); ++m) {
    const int64_t n = muon_->units()[m].geometry.shard_numel;
    const Tensor update = muon_update_.narrow(0, 0, n), out = muon_out_.narrow(0, 0, n);
    // momentum = beta momentum + (1 - beta) g; the update: Nesterov's beta momentum +
    // (1 - beta) g, else the momentum (PyTorch's Muon, its lerps written out).
    for (size_t i : muon_ranges_[m]) {
      const OptimizerRange& r = ranges_[i];
      const Tensor u = update.narrow(0, r.shard_offset, r.main.numel());
      ops::axpby(ctx_, exp_avg_[i], (1 - beta) * grad_scale, r.grad, beta);
      ops::copy(ctx_, u, exp_avg_[i]);
      if (o.nesterov) ops::axpby(ctx_, u, (1 - beta) * grad_scale, r.grad, beta);
    }
    muon_->orthogonalize(m, update, out);
    // param = (1 - lr wd) param - lr * (the scaled, orthogonalized update).
    for (size_t i : muon_ranges_[m]) {
      const OptimizerRange& r = ranges_[i];
      const double wd = r.weight_decay ? config_.weight_decay : 0.0;
      ops::axpby(ctx_, r.main, -lr, out.narrow(0, r.shard_offset, r.main.numel()), 1.0 - lr * wd);
      if (r.param_copy.defined()) ops::copy(ctx_, r.param_copy, r.main);
    }
  }
}

size_t Optimizer::state_bytes() const {
  return arena_bytes_;
}

double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0 || norm <= max_norm) return 1.0;
  return max_norm / (norm + 1e-6);
}

}  // namespace fsdp
