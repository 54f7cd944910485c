#include "runtime/train/moe_step.h"

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"
#include "runtime/core/error.h"

namespace fsdp::train {

MoeStep::MoeStep(models::LanguageModel& model, double bias_update_rate, bool record_tokens)
    : layers_(model.moe_layers()), rate_(bias_update_rate), record_tokens_(record_tokens) {}

void MoeStep::start_step() {
  for (nn::MoELayer* l : layers_) l->stats().reset();
}

std::vector<double> MoeStep::local_values(Context& ctx) const {
  // The layers' losses summed on the device, then one read-back for all of them.
  Tensor sum;
  for (nn::MoELayer* l : layers_) {
    const Tensor& losses = l->stats().losses;
    if (!losses.defined()) continue;
    if (!sum.defined()) sum = ops::zeros(ctx, Shape{2}, losses.dtype());
    ops::axpby(ctx, sum, 1.0, losses, 1.0);
  }
  std::vector<double> v = {0.0, 0.0};
  if (sum.defined()) v = ops::to_vector<double>(ctx, ops::cast(ctx, sum, DType::f64));
  for (nn::MoELayer* l : layers_)
    v.insert(v.end(), l->stats().counts.begin(), l->stats().counts.end());
  return v;
}

void MoeStep::finish_step(Context& ctx, const std::vector<double>& summed, double forwards,
                          StepMetrics& m) {
  if (!active()) return;
  size_t values = 2;
  for (nn::MoELayer* l : layers_) values += size_t(l->options().experts);
  FSDP_CHECK(summed.size() == values && forwards > 0, ValueError, "MoeStep::finish_step: ",
             summed.size(), " totals for ", values);
  // Per micro-batch, summed over the layers (each layer's loss is a mean over its tokens).
  m.moe_aux_loss = summed[0] / forwards;
  m.moe_z_loss = summed[1] / forwards;
  double worst = 0;
  size_t at = 2;
  for (nn::MoELayer* l : layers_) {
    const size_t E = size_t(l->options().experts);
    const std::vector<double> counts(summed.begin() + long(at), summed.begin() + long(at + E));
    at += E;
    double total = 0, most = 0;
    for (double c : counts) total += c, most = std::max(most, c);
    if (total > 0) worst = std::max(worst, most / (total / double(E)));
    if (record_tokens_) {
      std::vector<int64_t> tokens;
      for (double c : counts) tokens.push_back(std::llround(c));
      m.moe_expert_tokens.push_back(std::move(tokens));
    }
    l->update_expert_bias(ctx, counts, rate_);
  }
  m.moe_max_load = worst;
}

}  // namespace fsdp::train
