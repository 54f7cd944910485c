// Learning-rate schedules: linear warmup, then constant, linear or cosine decay to min_lr,
// or warmup-stable-decay (WSD). A schedule is a value; lr_at() is a pure function of the
// 0-based optimizer step, so resuming at step k needs nothing but k.
#pragma once

#include <cstdint>
#include <string>

namespace fsdp::train {

struct Recipe;

enum class DecayStyle { Constant, Linear, Cosine, WSD };
// Shape of WSD's final decay phase, as a coefficient going from 1 to 0.
enum class WsdDecayStyle { Linear, Cosine, Exponential, MinusSqrt };

// "constant" | "linear" | "cosine" | "WSD"; throws ConfigError for anything else.
DecayStyle decay_style_from_name(const std::string& name);
// "linear" | "cosine" | "exponential" | "minus_sqrt"; throws ConfigError for anything else.
WsdDecayStyle wsd_decay_style_from_name(const std::string& name);

struct LrSchedule {
  double lr = 0;                  // peak, reached at the end of warmup
  double min_lr = 0;              // floor, reached at decay_iters
  int64_t warmup_iters = 0;
  int64_t decay_iters = 0;        // step where decay ends (counted from 0, warmup included)
  int64_t wsd_decay_iters = 0;    // WSD: length of the final decay phase ending at decay_iters
  DecayStyle style = DecayStyle::Constant;
  WsdDecayStyle wsd_style = WsdDecayStyle::Linear;

  // Step `iter` (0-based) uses:
  //   iter < warmup_iters:           lr * (iter + 1) / warmup_iters
  //   constant:                      lr
  //   iter >= decay_iters:           min_lr
  //   linear / cosine:               min_lr + (lr - min_lr) * coeff(ratio),
  //                                  ratio = (iter - warmup) / (decay_iters - warmup),
  //                                  coeff = 1 - ratio  or  (1 + cos(pi * ratio)) / 2
  //   WSD:                           lr until decay_iters - wsd_decay_iters, then
  //                                  min_lr + (lr - min_lr) * coeff(ratio) over the last
  //                                  wsd_decay_iters steps.
  // Throws ValueError for a negative iter.
  double lr_at(int64_t iter) const;

  // The schedule a recipe asks for (its scheduler and optimizer sections).
  static LrSchedule from_recipe(const Recipe& recipe);
};

}  // namespace fsdp::train
