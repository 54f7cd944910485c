#include "runtime/optim/optimizer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "kernels/nn_ops.h"
#include "kernels/ops.h"
#include "runtime/core/arena.h"

namespace fsdp {

Optimizer::Optimizer(Context& ctx, std::vector<OptimizerRange> ranges, const OptimizerConfig& config)
    : ctx_(ctx), ranges_(std::move(ranges)), config_(config) {
  FSDP_CHECK(config.kind == "adamw" || config.kind == "sgd", ConfigError,
             "optimizer.optimizer: unknown optimizer '", config.kind, "' (adamw or sgd)");
  FSDP_CHECK(config.moments_dtype == DType::f32 || config.moments_dtype == DType::bf16,
             ConfigError, "optimizer.moments_dtype must be f32 or bf16");
  ArenaLayout layout;
  size_t on_host = 0;
  for (const OptimizerRange& r : ranges_) {
    FSDP_CHECK(r.main.numel() == r.grad.numel(), ShapeError, "optimizer range ", r.name,
               ": ", r.main.numel(), " weights but ", r.grad.numel(), " gradients");
    layout.add(r.main.numel());
    on_host += r.main.device().is_cpu() ? 1 : 0;
  }
  offload_ = ctx.is_cuda() && on_host > 0;
  FSDP_CHECK(!offload_ || on_host == ranges_.size(), ValueError,
             "optimizer: some ranges' master weights are on the host and some on the device");
  FSDP_CHECK(!offload_ || config.kind == "adamw", ConfigError,
             "optimizer.cpu_offload supports adamw only, not ", config.kind);
  if (config.kind == "adamw" && !layout.empty()) {
    // Each moment is one zeroed allocation; the ranges' moments are views into it.
    for (auto* moments : {&exp_avg_, &exp_avg_sq_}) {
      Tensor arena;
      if (offload_) {
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
  if (offload_) {
    for (const OptimizerRange& r : ranges_) {
      host_grad_.push_back(ctx.empty_pinned(r.grad.shape(), r.grad.dtype()));
      host_bytes_ += allocation_size_class(std::max<size_t>(host_grad_.back().nbytes(), 1));
      Tensor copy;
      if (r.param_copy.defined()) {
        copy = ctx.empty_pinned(r.param_copy.shape(), r.param_copy.dtype());
        host_bytes_ += allocation_size_class(std::max<size_t>(copy.nbytes(), 1));
      }
      host_copy_.push_back(copy);
    }
  }
}

void Optimizer::offloaded_step(const ops::AdamWParams& common) {
  // Gradients down (each copy waits for the device: the gradients are final only once the
  // step's reductions ran).
  for (size_t i = 0; i < ranges_.size(); ++i)
    if (ranges_[i].main.numel() > 0) ops::copy(ctx_, host_grad_[i], ranges_[i].grad);
  // The update on the host's cores, in chunks of one range each; elementwise, so the
  // result does not depend on how the work is split.
  struct Chunk {
    size_t range;
    int64_t begin, n;
  };
  std::vector<Chunk> chunks;
  constexpr int64_t kChunk = int64_t(1) << 20;
  for (size_t i = 0; i < ranges_.size(); ++i)
    for (int64_t b = 0; b < ranges_[i].main.numel(); b += kChunk)
      chunks.push_back({i, b, std::min(kChunk, ranges_[i].main.numel() - b)});
  std::atomic<size_t> next{0};
  std::mutex failed_mu;
  std::exception_ptr failed;
  auto run_chunks = [&] {
    for (size_t k = next++; k < chunks.size(); k = next++) {
      const Chunk& ch = chunks[k];
      const OptimizerRange& r = ranges_[ch.range];
      ops::AdamWParams p = common;
      p.weight_decay = r.weight_decay ? config_.weight_decay : 0.0;
      auto flat = [&](const Tensor& t) { return t.view(Shape{t.numel()}).narrow(0, ch.begin, ch.n); };
      const Tensor& copy = host_copy_[ch.range];
      ops::adamw_step(host_ctx_, flat(r.main), flat(host_grad_[ch.range]),
                      flat(exp_avg_[ch.range]), flat(exp_avg_sq_[ch.range]), p,
                      copy.defined() ? flat(copy) : Tensor());
    }
  };
  auto work = [&] {
    try {
      run_chunks();
    } catch (...) {
      std::lock_guard<std::mutex> lock(failed_mu);
      if (!failed) failed = std::current_exception();
      next = chunks.size();  // the other threads stop too
    }
  };
  const unsigned threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (failed) std::rethrow_exception(failed);
  // The new compute weights up (asynchronous; the next step's downloads come after them on
  // the stream, so the host copies are not rewritten before they have left).
  for (size_t i = 0; i < ranges_.size(); ++i)
    if (host_copy_[i].defined() && ranges_[i].main.numel() > 0)
      ops::copy(ctx_, ranges_[i].param_copy, host_copy_[i]);
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
    offloaded_step(adam);
    return;
  }
  for (size_t i = 0; i < ranges_.size(); ++i) {
    const OptimizerRange& r = ranges_[i];
    if (r.main.numel() == 0) continue;
    const double wd = r.weight_decay ? config_.weight_decay : 0.0;
    if (config_.kind == "adamw") {
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

size_t Optimizer::state_bytes() const { return arena_bytes_; }

double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0 || norm <= max_norm) return 1.0;
  return max_norm / (norm + 1e-6);
}

}  // namespace fsdp
