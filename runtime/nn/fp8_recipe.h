// How a linear layer's products run in FP8 (Parameter::fp8, set on its weight by a plan
// from outside the model: runtime/parallel/fp8_plan.h).
#pragma once

#include <array>
#include <cstdint>

#include "kernels/fp8_format.h"
#include "runtime/core/tensor.h"

namespace fsdp::nn {

// Where each operand's scale comes from (scale = the format's max / amax).
//   tensorwise: current scaling, the amax of the operand's own values at that moment (one
//     extra read of the operand). Transformer Engine's Float8CurrentScaling.
//   delayed: the amax of the operand in earlier steps (an amax history, as Transformer
//     Engine's DelayedScaling keeps it); the quantization records this step's amax in the
//     same read. The first step, with nothing in the history yet, scales as tensorwise.
//   blockwise: one scale per block, from the block's own amax, as DeepSeek-V3 trained:
//     inputs and output gradients in 1x128 blocks along each product's K, weights in
//     128x128 blocks (kernels/fp8_format.h). No amax is shared between ranks or steps. Only
//     layers whose sizes (tokens included) are multiples of 128 (fp8::applies).
//   rowwise: one scale per row of each K-major operand, from the row's own amax, as
//     torchao's rowwise float8 recipe: the forward's input per token and weight per output
//     feature; dgrad's weight per input feature; wgrad's operands per feature over the
//     tokens. No amax is kept between steps.
enum class Fp8Scaling : uint8_t { tensorwise, delayed, blockwise, rowwise };

// The operands of an FP8 layer, in the order of Fp8LayerAmax's entries, as matrices:
// input (tokens, in), weight (out, in), output gradient (tokens, out).
enum class Fp8Operand : int { input = 0, weight = 1, output_grad = 2 };
constexpr int kFp8Operands = 3;

// Which axis of an operand a tensor-parallel split divides over the ranks.
enum class Fp8Split : uint8_t { none, rows, columns };

// One layer's delayed-scaling state, on the layer's device: views into the buffers of
// runtime/parallel/fp8_delayed_scaling.h, which owns them and moves them after each step.
struct Fp8LayerAmax {
  Tensor scale_amax;  // (3) f32: the amax each operand is scaled by in this step
  Tensor step_amax;   // (3) f32: the largest |value| each operand has shown in this step
  const bool* primed = nullptr;  // whether the history holds a step yet (owned there too)
};

class ParallelGroup;

struct Fp8Recipe {
  kernels::Fp8Format forward = kernels::Fp8Format::e4m3;   // inputs and weights
  kernels::Fp8Format backward = kernels::Fp8Format::e4m3;  // output gradients (e5m2: "hybrid")
  Fp8Scaling scaling = Fp8Scaling::tensorwise;
  Fp8LayerAmax delayed;  // scaling == delayed only
  // The ranks that split the layer's tokens among them (context parallelism), or null: a
  // current amax of an input or output gradient is the maximum over them, so that every
  // rank scales by the amax the whole sequence has, as one process would.
  ParallelGroup* token_group = nullptr;
  // The tensor-parallel group of a split layer, or null, and how it splits each operand:
  // a column-parallel layer its weight's rows and its output gradient's columns, a
  // row-parallel one its weight's and its input's columns. A current amax over a split
  // axis (tensor-wise: any; row-wise: a row's over split columns, a column's over split
  // rows) is the maximum over the group, as the whole operand's is.
  ParallelGroup* feature_group = nullptr;
  std::array<Fp8Split, kFp8Operands> split{};
  // The weight is unchanged from one update to the next (FSDP's no_shard, ZeRO-1 and
  // ZeRO-2 keep the full weights) and whoever runs the steps clears Fp8Weight::cast
  // whenever new weights are written (the trainer's FP8 step participant):
  // the weight is then cast once per step, both layouts in one read, instead of once per
  // product in every micro-batch.
  bool cache_weight = false;
};

}  // namespace fsdp::nn
