// The FP8 plan: which linear layers of a model run their products in FP8, set from outside
// the model (as the tensor-parallel plan sets styles), on specs or materialized models.
//
// Every Linear inside the transformer blocks (modules of kind "block", in forward order)
// runs in FP8 except those of the first `bf16_blocks_at_start` and the last
// `bf16_blocks_at_end` blocks (Megatron's first_last_layers_bf16 with
// num_layers_at_start_in_bf16 / num_layers_at_end_in_bf16). Layers outside the blocks (the
// head, the embeddings) never run in FP8, nor do MoE layers' routers and experts (the
// experts' grouped matmul has no FP8 path yet); a shared expert's MLP does, as a dense MLP.
#pragma once

#include <string>
#include <vector>

#include "runtime/nn/fp8.h"
#include "runtime/nn/module.h"

namespace fsdp::nn {

struct Fp8Plan {
  Fp8Recipe recipe;
  int bf16_blocks_at_start = 0;
  int bf16_blocks_at_end = 0;
};

// What apply_fp8 did: the FP8 layers' names in forward order, and the blocks left in the
// compute dtype.
struct Fp8Layers {
  std::vector<std::string> layers;
  // The kinds of those layers, each once, named within their block ("attn.qkv").
  std::vector<std::string> kinds;
  // The blocks in FP8 are [first_block, last_block]; the others stay in the compute dtype.
  int first_block = 0, last_block = -1;
  std::vector<int> bf16_blocks;
  // One line for a run's start-up report, e.g. "fp8: hybrid (f8e4m3 forward, e5m2
  // gradients), tensorwise current scaling: 40 linear layers in blocks 1..10 (attn.qkv,
  // attn.proj, mlp.fc, mlp.proj); in bf16: blocks 0, 11, the head".
  std::string summary(const std::string& scaling) const;
};

// Sets the recipe on the planned layers of `model` (and clears it on every other Linear).
// Throws ConfigError when the plan leaves no block in FP8, and the errors of
// Linear::set_fp8 (a tensor-parallel layer, features not multiples of 16) naming the layer.
Fp8Layers apply_fp8(Module& model, const Fp8Plan& plan);

}  // namespace fsdp::nn
