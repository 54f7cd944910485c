// Delayed scaling for FP8 layers (mixed_precision.fp8_recipe "delayed"): every operand of
// every FP8 layer (input, weight, output gradient) is quantized with a scale from the amaxes
// it showed in earlier steps, and its quantization records this step's amax in the same
// read, so no separate amax pass runs before each cast (as Transformer Engine's
// DelayedScaling).
//
// A step, as the trainer drives it:
//   start_step      zeroes the step amaxes (an evaluation's forwards in between leave
//                   nothing behind);
//   forward/backward  each quantization scales by scale_amax and max-accumulates step_amax;
//   finish_step     takes the maximum of the step amaxes over every rank (one all-reduce for
//                   all layers), pushes it into each history and derives the next scale_amax.
// The step's amax is thus the maximum over every micro-batch of every rank: the same number
// on every rank and for any layout, so runs of any data-, context-parallel or ZeRO layout
// quantize exactly as the single-process run does. Until the first finish_step (nothing in
// the history), layers scale tensor-wise from their operands' current amaxes.
//
// The histories are training state: checkpoints hold them (buffers named
// "<layer>.fp8_amax_history", (len, 3)) and a resumed run continues bit for bit. A
// checkpoint without them (saved with another recipe), or without some layers' (saved with
// other FP8 layers), leaves every history empty, and the first step scales tensor-wise again.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/core/context.h"
#include "runtime/nn/parameter.h"

namespace fsdp {

struct Fp8DelayedOptions {
  int64_t history_len = 1;  // mixed_precision.fp8_amax_history_len
  bool use_max = false;     // fp8_amax_compute_algo "max" (else "most_recent")
  int margin = 0;           // fp8_margin: scales 2^margin below the format's max
};

class Fp8DelayedScaling {
 public:
  // State for the FP8 layers whose weights are `weights` (named `layers`, in the same order);
  // sets each weight's recipe to delayed scaling with views of its own state.
  Fp8DelayedScaling(Context& ctx, const std::vector<std::string>& layers,
                    const std::vector<nn::Parameter*>& weights, const Fp8DelayedOptions& options);
  Fp8DelayedScaling(const Fp8DelayedScaling&) = delete;
  Fp8DelayedScaling& operator=(const Fp8DelayedScaling&) = delete;

  void start_step(Context& ctx);
  // Collective over `world` (null: a single process): every rank calls it after the step's
  // last backward, before the next forward.
  void finish_step(Context& ctx, Communicator* world);

  // Each layer's history (len, 3) by checkpoint name ("h.1.attn.qkv.fp8_amax_history"):
  // views that a save reads and a load writes.
  std::vector<std::pair<std::string, Tensor>> histories() const;
  // After a load wrote histories(): the scales they give, and whether they hold a step.
  // (Reads one flag back from the device.)
  void after_load(Context& ctx);

  bool primed() const { return primed_; }
  // (layers, 3) f32: the amaxes the next step scales by (tests).
  const Tensor& scale_amax() const { return scale_amax_; }

 private:
  Fp8DelayedOptions options_;
  std::vector<std::string> layers_;
  Tensor history_;     // (layers, len, 3) f32, entry 0 the newest
  Tensor step_amax_;   // (layers, 3) f32
  Tensor scale_amax_;  // (layers, 3) f32
  bool primed_ = false;
};

}  // namespace fsdp
