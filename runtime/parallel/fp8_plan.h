// FP8 training applied from outside a model, as the other plans are: apply_fp8() marks the
// linear layers of the transformer blocks (attention qkv and proj, MLP fc / gate_up and
// proj) to run their products in FP8 (nn::Fp8Recipe on the weight); their layers then
// quantize inputs, weights and output gradients around each product, as the recipe scales
// them (runtime/nn/fp8_linear.h). What stays in bf16, as Transformer Engine recipes keep it:
// the embedding and the classifier (unless the plan asks for it), the first and last blocks by default
// (their inputs and gradients have the widest ranges), attention's softmax products, the
// norms, and the MoE routers and experts' grouped products (an MoE layer's shared expert is
// a dense MLP and runs in FP8).
//
// Under tensor parallelism the column- and row-parallel layers run in FP8 too: the amax of
// every operand split over the group (nn::Fp8Recipe::split) is the maximum over
// its ranks, so each rank quantizes its slice as the single process quantizes the whole
// operand. But a query-key-value layer whose key/value heads are replicated on several
// ranks (fewer of them than ranks) keeps bf16: each rank's gradient of a replicated head is
// a part of the head's gradient, and quantizing the parts is not quantizing their sum.
#pragma once

#include <string>
#include <vector>

#include "runtime/nn/fp8_recipe.h"
#include "runtime/nn/layer_table.h"
#include "runtime/nn/module.h"

namespace fsdp {

struct Fp8Plan {
  nn::Fp8Recipe recipe;
  int bf16_first_blocks = 1;  // the first blocks kept in bf16
  int bf16_last_blocks = 1;   // the last blocks kept in bf16
  bool classifier = false;    // the output head (apply_fp8's `head`) in FP8 too
  // The context-parallel group, when the sequence is split (nn::Fp8Recipe::token_group).
  nn::ParallelGroup* token_group = nullptr;
};

// What apply_fp8 did: the linear layers it marked ("h.1.attn.qkv") and the blocks it kept
// in bf16 ("h.0"), in forward order.
struct Fp8Report {
  std::vector<std::string> fp8_layers;
  std::vector<nn::Parameter*> fp8_weights;  // the marked layers' weights, as fp8_layers
  std::vector<std::string> bf16_blocks;
  // Linear layers of the FP8 blocks kept in bf16, with why ("h.1.attn.qkv (replicated
  // key/value heads)"), and an output head the plan wanted in FP8 but kept in bf16.
  std::vector<std::string> bf16_layers;
  // The output head's layer name when it runs in FP8 ("lm_head"; also in fp8_layers, last).
  std::string classifier;
};

// Marks the products `table` names in `model` (its column, column_heads and row Linears)
// inside its blocks (style block, in forward order) but the first and last ones the plan
// keeps in bf16, and with plan.classifier the output head's weight `head`
// (nn::classifier_loss; a vocabulary-parallel head stays in bf16, reported).
Fp8Report apply_fp8(nn::Module& model, const nn::LayerTable& table, const Fp8Plan& plan,
                    nn::Parameter* head = nullptr);

}  // namespace fsdp
