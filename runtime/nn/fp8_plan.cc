#include "runtime/nn/fp8_plan.h"

#include <set>

#include "runtime/core/error.h"
#include "runtime/nn/layers.h"
#include "runtime/nn/moe.h"

namespace fsdp::nn {

Fp8Layers apply_fp8(Module& model, const Fp8Plan& plan) {
  const std::vector<Module*> blocks = model.modules_of_kind("block");
  const int n = int(blocks.size());
  FSDP_CHECK(plan.bf16_blocks_at_start >= 0 && plan.bf16_blocks_at_end >= 0, ConfigError,
             "FP8 plan: negative block counts");
  FSDP_CHECK(plan.bf16_blocks_at_start + plan.bf16_blocks_at_end < n, ConfigError,
             "FP8 plan: keeping ", plan.bf16_blocks_at_start, " block(s) at the start and ",
             plan.bf16_blocks_at_end, " at the end in bf16 leaves none of the model's ", n,
             " in FP8");
  for (Module* m : model.modules_of_kind("linear")) static_cast<Linear*>(m)->set_fp8(std::nullopt);
  Fp8Layers out;
  out.first_block = plan.bf16_blocks_at_start;
  out.last_block = n - 1 - plan.bf16_blocks_at_end;
  std::set<std::string> seen;
  for (int i = 0; i < n; ++i) {
    if (i < out.first_block || i > out.last_block) {
      out.bf16_blocks.push_back(i);
      continue;
    }
    const std::string& block = blocks[size_t(i)]->name();
    // A router picks experts from its logits: it stays in the compute dtype (and E is often
    // not a multiple of 16).
    std::set<const Module*> routers;
    for (Module* m : blocks[size_t(i)]->modules_of_kind("mlp"))
      if (auto* moe = dynamic_cast<MoELayer*>(m)) routers.insert(&moe->router);
    for (Module* m : blocks[size_t(i)]->modules_of_kind("linear")) {
      if (routers.count(m)) continue;
      static_cast<Linear*>(m)->set_fp8(plan.recipe);
      out.layers.push_back(m->name());
      const std::string kind = m->name().substr(block.empty() ? 0 : block.size() + 1);
      if (seen.insert(kind).second) out.kinds.push_back(kind);
    }
  }
  return out;
}

std::string Fp8Layers::summary(const std::string& scaling) const {
  std::string kinds_text, bf16_text;
  for (size_t i = 0; i < kinds.size(); ++i) kinds_text += (i ? ", " : "") + kinds[i];
  for (int b : bf16_blocks) bf16_text += str_cat(b, ", ");
  return str_cat("fp8: ", layers.size(), " linear layers of blocks ", first_block, "..",
                 last_block, " (", kinds_text, ") in ", scaling, "; in bf16: ",
                 bf16_blocks.empty() ? std::string() : "blocks " + bf16_text, "the head");
}

}  // namespace fsdp::nn
