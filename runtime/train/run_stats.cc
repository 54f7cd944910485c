#include "runtime/train/run_stats.h"

#include "runtime/core/nvtx.h"

namespace fsdp::train {
namespace {

double seconds_between(std::chrono::steady_clock::time_point a,
                       std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

// ---------------------------------------------------------------- StepClock

StepClock::StepClock(Context& ctx) : ctx_(ctx) {
  if (!ctx.is_cuda()) return;
  for (Event* e : {&micro_batches_start_, &micro_batches_end_, &optimizer_start_, &optimizer_end_})
    *e = Event::create(ctx.device(), /*enable_timing=*/true);
}

void StepClock::start_step() { step_start_ = Clock::now(); }

void StepClock::start_micro_batches() { micro_batches_start_.record(ctx_.stream()); }

void StepClock::micro_batches_queued() {
  micro_batches_end_.record(ctx_.stream());
  queue_s_ = seconds_between(step_start_, Clock::now());
}

void StepClock::start_optimizer() {
  optimizer_start_host_ = Clock::now();
  optimizer_start_.record(ctx_.stream());
}

void StepClock::end_optimizer() {
  optimizer_end_.record(ctx_.stream());
  optimizer_host_s_ = seconds_between(optimizer_start_host_, Clock::now());
}

void StepClock::step_issued() { issue_s_ = seconds_between(step_start_, Clock::now()); }

StepClock::Times StepClock::times() const {
  Times t;
  t.queue_s = queue_s_;
  t.issue_s = issue_s_;
  if (ctx_.is_cuda()) {
    t.forward_backward_s = Event::elapsed_ms(micro_batches_start_, micro_batches_end_) / 1000.0;
    t.optimizer_s = Event::elapsed_ms(optimizer_start_, optimizer_end_) / 1000.0;
  } else {
    t.forward_backward_s = queue_s_;
    t.optimizer_s = optimizer_host_s_;
  }
  return t;
}

// ---------------------------------------------------------------- RunStats

RunStats::RunStats(Context& ctx, int64_t first_step, int64_t warmup_steps, bool profile,
                   int64_t tokens_per_step, double flops_per_token, int world_size)
    : ctx_(ctx), first_step_(first_step), warmup_steps_(warmup_steps), profile_(profile),
      tokens_per_step_(tokens_per_step), flops_per_token_(flops_per_token), world_size_(world_size) {
  ctx_.allocator()->reset_peak();
}

void RunStats::start_step(int64_t step) {
  if (!timed(step) || timed_steps_ > 0) return;
  // The first timed step: the profiler window opens and the allocation counts start.
  if (profile_) profiler_capture(true);
  allocs_before_ = ctx_.allocator()->stats();
}

void RunStats::end_step(int64_t step, double wall_s, const StepClock::Times& t,
                        const CollectiveTimes& c) {
  if (!timed(step)) return;  // warm-up steps are not counted
  wall_s_ += wall_s;
  sums_.queue_s += t.queue_s;
  sums_.issue_s += t.issue_s;
  sums_.forward_backward_s += t.forward_backward_s;
  sums_.optimizer_s += t.optimizer_s;
  auto add = [](TrainResult::Collective& to, const CollectiveTime& from) {
    to.count += double(from.count);
    to.bytes += double(from.bytes);
    to.ms += from.ms;
  };
  add(all_gathers_, c.all_gather);
  add(reduce_scatters_, c.reduce_scatter);
  add(all_reduces_, c.all_reduce);
  timed_steps_++;
}

StepMetrics RunStats::metrics(int64_t step, double loss, double lr, double grad_norm,
                              double wall_s) const {
  StepMetrics m;
  m.step = step;
  m.loss = loss;
  m.lr = lr;
  m.grad_norm = grad_norm;
  m.step_time_s = wall_s;
  m.tokens_per_sec = double(tokens_per_step_) / wall_s;
  m.mem_peak_bytes = int64_t(ctx_.allocator()->stats().peak_in_use);
  if (ctx_.is_cuda()) {
    const double per_gpu = m.tokens_per_sec / world_size_;
    m.tflops = per_gpu * flops_per_token_ / 1e12;
    m.mfu = model_flops_utilization(per_gpu, flops_per_token_, kH200PeakBf16Flops);
  }
  return m;
}

void RunStats::finish(TrainResult& r) {
  const MemoryStats mem = ctx_.allocator()->stats();
  r.peak_allocated_bytes = int64_t(mem.peak_in_use);
  r.peak_reserved_bytes = int64_t(mem.peak_reserved);
  if (ctx_.is_cuda()) {
    const Device device = ctx_.device();
    r.device_bytes_outside_allocator = int64_t(device_memory_bytes(device)) -
                                       int64_t(device_memory_free_bytes(device)) -
                                       int64_t(mem.reserved);
  }
  if (timed_steps_ == 0) return;
  if (profile_) profiler_capture(false);
  const double n = double(timed_steps_);
  r.step_time_s = wall_s_ / n;
  r.optimizer_time_s = sums_.optimizer_s / n;
  r.issue_time_s = sums_.issue_s / n;
  r.queue_time_s = sums_.queue_s / n;
  r.forward_backward_s = sums_.forward_backward_s / n;
  r.allocs_per_step = double(mem.num_allocs - allocs_before_.num_allocs) / n;
  r.system_allocs_per_step = double(mem.num_system_allocs - allocs_before_.num_system_allocs) / n;
  r.all_gathers = all_gathers_;
  r.reduce_scatters = reduce_scatters_;
  r.all_reduces = all_reduces_;
  for (TrainResult::Collective* c : {&r.all_gathers, &r.reduce_scatters, &r.all_reduces}) {
    c->count /= n;
    c->bytes /= n;
    c->ms /= n;
  }
  r.tokens_per_sec = double(tokens_per_step_) / r.step_time_s;
  if (ctx_.is_cuda()) {
    const double per_device = r.tokens_per_sec / world_size_;
    r.tflops_per_device = per_device * flops_per_token_ / 1e12;
    r.mfu = model_flops_utilization(per_device, flops_per_token_, kH200PeakBf16Flops);
  }
}

}  // namespace fsdp::train
