#include "runtime/parallel/fp8_delayed_scaling.h"

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"
#include "runtime/core/error.h"

namespace fsdp {

Fp8DelayedScaling::Fp8DelayedScaling(Context& ctx, const std::vector<std::string>& layers,
                                     const std::vector<nn::Parameter*>& weights,
                                     const Fp8DelayedOptions& options)
    : options_(options), layers_(layers) {
  FSDP_CHECK(options.history_len >= 1, ConfigError,
             "'mixed_precision.fp8_amax_history_len' must be at least 1, got ", options.history_len);
  FSDP_CHECK(options.margin >= 0 && options.margin <= 64, ConfigError,
             "'mixed_precision.fp8_margin' must be in [0, 64], got ", options.margin);
  FSDP_CHECK(layers.size() == weights.size(), ValueError, "Fp8DelayedScaling: ", layers.size(),
             " layer names for ", weights.size(), " weights");
  const int64_t n = int64_t(layers.size());
  history_ = ops::zeros(ctx, Shape{n, options.history_len, nn::kFp8Operands}, DType::f32);
  step_amax_ = ops::zeros(ctx, Shape{n, nn::kFp8Operands}, DType::f32);
  scale_amax_ = ops::zeros(ctx, Shape{n, nn::kFp8Operands}, DType::f32);
  for (int64_t i = 0; i < n; ++i) {
    nn::Parameter& w = *weights[size_t(i)];
    FSDP_CHECK(w.fp8.has_value(), ValueError, "Fp8DelayedScaling: ", w.name(),
               " is not marked for FP8");
    w.fp8->recipe.scaling = nn::Fp8Scaling::delayed;
    w.fp8->recipe.delayed = {scale_amax_.select(0, i), step_amax_.select(0, i), &primed_};
  }
}

void Fp8DelayedScaling::start_step(Context& ctx) {
  if (step_amax_.numel() > 0) ops::fill(ctx, step_amax_, 0.0);
}

void Fp8DelayedScaling::finish_step(Context& ctx, Communicator* world) {
  if (layers_.empty()) return;
  if (world && world->size() > 1) world->all_reduce(step_amax_, ReduceOp::Max, ctx.stream());
  ops::fp8_update_amax_histories(ctx, history_, step_amax_, scale_amax_, /*roll=*/true,
                                 options_.use_max, std::ldexp(1.0f, options_.margin));
  primed_ = true;
}

std::vector<std::pair<std::string, Tensor>> Fp8DelayedScaling::histories() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < layers_.size(); ++i)
    out.emplace_back(layers_[i] + ".fp8_amax_history", history_.select(0, int64_t(i)));
  return out;
}

void Fp8DelayedScaling::after_load(Context& ctx) {
  if (layers_.empty()) return;
  // A layer's history holds a step once any amax in it is positive (an empty one is all
  // zeros). The histories are primed together or not at all: a checkpoint that has some
  // layers' and not others' (saved with other FP8 layers, e.g. without the classifier)
  // starts every history afresh, since a layer with an empty history would scale by an
  // amax of 0 (a scale of 1) while the others scaled by theirs.
  const std::vector<float> h = ops::to_vector<float>(ctx, history_);
  const size_t per_layer = h.size() / layers_.size();
  size_t filled = 0;
  for (size_t i = 0; i < layers_.size(); ++i)
    filled += std::any_of(h.begin() + ptrdiff_t(i * per_layer), h.begin() + ptrdiff_t((i + 1) * per_layer),
                          [](float v) { return v > 0.0f; });
  primed_ = filled == layers_.size();
  if (!primed_) ops::fill(ctx, history_, 0.0);
  ops::fp8_update_amax_histories(ctx, history_, step_amax_, scale_amax_, /*roll=*/false,
                                 options_.use_max, std::ldexp(1.0f, options_.margin));
}

}  // namespace fsdp
