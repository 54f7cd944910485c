// FP8 training of the transformer blocks' linear layers (Hopper, compute capability 8.9+).
//
// A Linear (or an MLP's pair of them) whose Fp8Recipe is set runs its three products in FP8
// on the tensor cores: the forward y = x W^T (e4m3 x e4m3), the input gradient
// dx = dy W and the weight gradient dW = dy^T x (the output gradient dy in e5m2 under
// "hybrid", in e4m3 otherwise). Each operand is quantized with its own per-tensor scale
// taken from its current largest magnitude ("tensorwise" current scaling, kernels/nn_ops.h:
// fp8_scales), products accumulate in f32 and come out in the compute dtype (bf16), weight
// gradients into their f32 (or bf16) accumulation buffers. Master weights, optimizer,
// norms, attention, the residual stream and the head stay as they are.
//
// Models never mention FP8: a plan sets the recipe on the layers from outside
// (apply_fp8, runtime/nn/fp8_plan.h), as the tensor-parallel plan sets styles.
#pragma once

#include <string>

#include "runtime/core/dtype.h"

namespace fsdp::nn {

struct Fp8Recipe {
  DType forward = DType::f8e4m3;   // activations and weights
  DType backward = DType::f8e5m2;  // output gradients: f8e5m2 ("hybrid") or f8e4m3 ("e4m3")

  // "hybrid (e4m3 forward, e5m2 gradients)" or "e4m3 (forward and gradients)".
  std::string str() const;
  bool operator==(const Fp8Recipe& o) const {
    return forward == o.forward && backward == o.backward;
  }
  bool operator!=(const Fp8Recipe& o) const { return !(*this == o); }
};

// The recipes Megatron-Bridge's mixed_precision.fp8 names: "hybrid" or "e4m3". Throws
// ConfigError naming the value otherwise.
Fp8Recipe fp8_recipe_from_name(const std::string& name);

// FP8 matmuls need every dimension a multiple of this (cuBLASLt's FP8 kernels).
constexpr int64_t kFp8Multiple = 16;

}  // namespace fsdp::nn
