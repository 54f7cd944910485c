#include "runtime/train/lr_schedule.h"

#include <cmath>

#include "runtime/core/error.h"
#include "runtime/train/recipe.h"

namespace fsdp::train {
namespace {

constexpr double kPi = 3.14159265358979323846;

double cosine_coeff(double ratio) { return 0.5 * (1.0 + std::cos(kPi * ratio)); }

double wsd_coeff(WsdDecayStyle style, double ratio) {
  switch (style) {
    case WsdDecayStyle::Linear: return 1.0 - ratio;
    case WsdDecayStyle::Cosine: return cosine_coeff(ratio);
    case WsdDecayStyle::Exponential: return 2.0 * std::pow(0.5, ratio) - 1.0;
    case WsdDecayStyle::MinusSqrt: return 1.0 - std::sqrt(ratio);
  }
  return 1.0 - ratio;  // unreachable: every style is handled above
}

}  // namespace

DecayStyle decay_style_from_name(const std::string& name) {
  if (name == "constant") return DecayStyle::Constant;
  if (name == "linear") return DecayStyle::Linear;
  if (name == "cosine") return DecayStyle::Cosine;
  if (name == "WSD") return DecayStyle::WSD;
  FSDP_THROW(ConfigError, "'scheduler.lr_decay_style' must be one of \"constant\", \"linear\", "
                          "\"cosine\", \"WSD\", got \"", name, "\"");
}

WsdDecayStyle wsd_decay_style_from_name(const std::string& name) {
  if (name == "linear") return WsdDecayStyle::Linear;
  if (name == "cosine") return WsdDecayStyle::Cosine;
  if (name == "exponential") return WsdDecayStyle::Exponential;
  if (name == "minus_sqrt") return WsdDecayStyle::MinusSqrt;
  FSDP_THROW(ConfigError, "'scheduler.lr_wsd_decay_style' must be one of \"linear\", \"cosine\", "
                          "\"exponential\", \"minus_sqrt\", got \"", name, "\"");
}

double LrSchedule::lr_at(int64_t iter) const {
  FSDP_CHECK(iter >= 0, ValueError, "learning-rate schedule asked for step ", iter);
  if (iter < warmup_iters) return lr * double(iter + 1) / double(warmup_iters);
  if (style == DecayStyle::Constant) return lr;
  if (iter >= decay_iters) return min_lr;
  if (style == DecayStyle::WSD) {
    int64_t anneal_start = decay_iters - wsd_decay_iters;
    if (iter < anneal_start) return lr;
    double ratio = double(iter - anneal_start) / double(wsd_decay_iters);
    return min_lr + (lr - min_lr) * wsd_coeff(wsd_style, ratio);
  }
  // Here warmup_iters <= iter < decay_iters, so the denominator is positive.
  double ratio = double(iter - warmup_iters) / double(decay_iters - warmup_iters);
  double coeff = style == DecayStyle::Linear ? 1.0 - ratio : cosine_coeff(ratio);
  return min_lr + (lr - min_lr) * coeff;
}

LrSchedule LrSchedule::from_recipe(const Recipe& recipe) {
  LrSchedule s;
  s.lr = recipe.optimizer.lr;
  s.min_lr = recipe.optimizer.min_lr;
  s.warmup_iters = recipe.scheduler.lr_warmup_iters;
  s.decay_iters = recipe.scheduler.lr_decay_iters;
  s.wsd_decay_iters = recipe.scheduler.lr_wsd_decay_iters;
  s.style = decay_style_from_name(recipe.scheduler.lr_decay_style);
  s.wsd_style = wsd_decay_style_from_name(recipe.scheduler.lr_wsd_decay_style);
  return s;
}

}  // namespace fsdp::train
