#include "runtime/optim/optimizer.h"

#include <cmath>
#include <cstring>

#include "kernels/ops.h"
#include "runtime/core/arena.h"

namespace fsdp {

Optimizer::Optimizer(Context& ctx, std::vector<OptimizerRange> ranges, const OptimizerConfig& config)
    : ctx_(ctx), ranges_(std::move(ranges)), config_(config) {
  FSDP_CHECK(config.moments_dtype == DType::f32 || config.moments_dtype == DType::bf16 ||
                 config.moments_dtype == DType::f64,
             ConfigError, "optimizer.moments_dtype must be f32, bf16 or f64");
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
    // Each moment is one zeroed allocation; the ranges' moments are views into it.
    for (auto* moments : {&exp_avg_, &exp_avg_sq_}) {
      Tensor arena;
      if (offload) {
        arena = ctx.empty_pinned(Shape{layout.numel}, config.moments_dtype);
        std::memset(arena.data_ptr(), 0, arena.nbytes());
        host_bytes_ += allocation_size_class(arena.nbytes());
      } else {
        arena = ops::zeros(ctx, Shape{layout.numel}, config.moments_dtype);
        arena_bytes_ += allocation_size_class(arena.nbytes());
      }
      for (size_t i = 0; i < ranges_.size(); ++i)
        moments->push_back(arena.narrow(0, layout.offsets[i], ranges_[i].main.numel()).view(ranges_[i].main.shape()));
    }
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
  for (size_t i = 0; i < ranges_.size(); ++i) {
    const OptimizerRange& r = ranges_[i];
    if (r.main.numel() == 0) continue;
    const double wd = r.weight_decay ? config_.weight_decay : 0.0;
    if (config_.kind == OptimizerKind::adamw) {
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

size_t Optimizer::state_bytes() const {
  return arena_bytes_;
}

double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0 || norm <= max_norm) return 1.0;
  return max_norm / (norm + 1e-6);
}

}  // namespace fsdp
