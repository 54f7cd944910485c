// How a linear layer's products run in FP8 (Parameter::fp8, set on its weight by a plan
// from outside the model: runtime/parallel/fp8_plan.h).
#pragma once

#include "kernels/fp8_format.h"

namespace fsdp::nn {

// Tensor-wise current scaling: each operand is quantized with one scale, max / amax of its
// own values at that moment (inputs and weights in `forward`, output gradients in
// `backward`). Transformer Engine's "tensorwise" (Float8CurrentScaling).
struct Fp8Recipe {
  kernels::Fp8Format forward = kernels::Fp8Format::e4m3;   // inputs and weights
  kernels::Fp8Format backward = kernels::Fp8Format::e4m3;  // output gradients (e5m2: "hybrid")
};

}  // namespace fsdp::nn
