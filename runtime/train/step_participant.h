// StepParticipant: a feature that takes part in every training step without the step
// naming it (the MoE layers' statistics, FP8 delayed scaling, update norms). The trainer
// calls every participant, in the order they were added, at these points of a step:
//
//   start_step            before the step's first forward
//   after_grad_sync       the gradients are reduced; before the norm and the update
//   local_values          this rank's values to be summed over the ranks (they ride on the
//                         all-reduce that carries the step's loss)
//   after_optimizer_step  the update is done and `summed` holds the sums of local_values:
//                         report into the step's metrics, prepare the next step
//   report                at the end of the run: what it measured, into the result
#pragma once

#include <vector>

#include "runtime/core/context.h"
#include "runtime/train/metrics.h"
#include "runtime/train/trainer.h"

namespace fsdp::train {

class StepParticipant {
 public:
  virtual ~StepParticipant() = default;
  virtual void start_step(Context& ctx) { (void)ctx; }
  virtual void after_grad_sync(Context& ctx) { (void)ctx; }
  virtual std::vector<double> local_values(Context& ctx) {
    (void)ctx;
    return {};
  }
  // `forwards`: the micro-batch forwards the sums cover, over every rank.
  virtual void after_optimizer_step(Context& ctx, const std::vector<double>& summed,
                                    double forwards, StepMetrics& m) {
    (void)ctx, (void)summed, (void)forwards, (void)m;
  }
  virtual void report(TrainResult& result) const { (void)result; }
};

}  // namespace fsdp::train
