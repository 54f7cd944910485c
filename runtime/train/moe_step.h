// The mixture-of-experts side of a training step: what the MoE layers measured (their
// auxiliary losses and tokens per expert) turned into the step's metrics, and the expert
// biases moved after the optimizer step.
//
// The layers add their values into their nn::MoeStats at every forward; a step resets them
// first, hands this rank's totals to the one all-reduce that already carries the loss, and
// finishes from the sums. Counts summed over every rank and micro-batch are the global
// batch's, the same for any layout: so is each bias update, identical on every rank.
#pragma once

#include <vector>

#include "models/language_model.h"
#include "runtime/train/metrics.h"

namespace fsdp::train {

class MoeStep {
 public:
  // `bias_update_rate`: model.moe_router_bias_update_rate; `record_tokens`:
  // logger.log_expert_tokens.
  MoeStep(models::LanguageModel& model, double bias_update_rate, bool record_tokens = false);
  bool active() const { return !layers_.empty(); }

  // Before the step's first forward.
  void start_step();
  // This rank's totals, to be summed over the ranks: [aux, z, then each layer's counts (E)].
  // (Waits for the device: the losses are summed there.)
  std::vector<double> local_values(Context& ctx) const;
  // From the summed totals (`summed` as local_values lays them out) and the number of
  // micro-batch forwards they cover over all ranks: sets m's MoE fields and moves the expert
  // biases (after the optimizer step, before the next forward).
  void finish_step(Context& ctx, const std::vector<double>& summed, double forwards,
                   StepMetrics& m);

 private:
  std::vector<nn::MoELayer*> layers_;
  double rate_;
  bool record_tokens_;
};

}  // namespace fsdp::train
