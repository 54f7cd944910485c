// The accounting of a training run, kept apart from the training loop: where one step's
// time went (StepClock), and over the timed steps the averages and peaks TrainResult reports
// and the numbers of each step line (RunStats).
#pragma once

#include <chrono>
#include <cstdint>

#include "runtime/core/context.h"
#include "collectives/collective_calls.h"
#include "runtime/fsdp/options.h"
#include "runtime/train/metrics.h"
#include "runtime/train/trainer.h"

namespace fsdp::train {

// The clocks of one step. On CUDA, events time the device's forwards and backwards and its
// optimizer step; on the CPU the host's clock stands in for the device's.
class StepClock {
 public:
  explicit StepClock(Context& ctx);

  void start_step();             // the step's host clock starts
  void start_micro_batches();    // the micro-batches' device span opens
  void micro_batches_queued();   // the span closes: the host's time to queue them
  void start_optimizer();
  void end_optimizer();
  void step_issued();           // the host's time to issue the whole step, before its loss

  struct Times {
    double queue_s = 0;             // host: queueing the forwards and backwards
    double issue_s = 0;             // host: issuing the step up to its wait for the loss
    double forward_backward_s = 0;  // device: first forward's start to last backward's end
    double optimizer_s = 0;         // device: the optimizer step and the weight install
  };
  // Call after the step has synchronized (its loss was read).
  Times times() const;

 private:
  using Clock = std::chrono::steady_clock;
  Context& ctx_;
  Event micro_batches_start_, micro_batches_end_, optimizer_start_, optimizer_end_;
  Clock::time_point step_start_, optimizer_start_host_;
  double queue_s_ = 0, issue_s_ = 0, optimizer_host_s_ = 0;
};

class RunStats {
 public:
  // `first_step`: steps completed before this run (a resume); the first `warmup_steps` of
  // this run are left out of the averages. `profile`: open the profiler's capture window
  // for the timed steps only.
  RunStats(Context& ctx, int64_t first_step, int64_t warmup_steps, bool profile,
           int64_t tokens_per_step, double flops_per_token, int world_size);

  void start_step(int64_t step);  // step: 1-based, the one about to run
  // After step `step` finished in `wall_s` seconds (its loss read on every rank).
  void end_step(int64_t step, double wall_s, const StepClock::Times& times,
                const CollectiveTimes& collectives);
  // The step line's record: loss, lr, norm, and the throughput, FLOP and memory numbers.
  StepMetrics metrics(int64_t step, double loss, double lr, double grad_norm, double wall_s) const;
  // The averages over the timed steps, FLOP/s, MFU, allocations and memory peaks.
  void finish(TrainResult& result);

 private:
  bool timed(int64_t step) const { return step - first_step_ > warmup_steps_; }

  Context& ctx_;
  int64_t first_step_, warmup_steps_;
  bool profile_;
  int64_t tokens_per_step_;
  double flops_per_token_;
  int world_size_;
  // Sums over the timed steps.
  int64_t timed_steps_ = 0;
  double wall_s_ = 0;
  StepClock::Times sums_;
  TrainResult::Collective all_gathers_, reduce_scatters_, all_reduces_;
  MemoryStats allocs_before_;
};

}  // namespace fsdp::train
