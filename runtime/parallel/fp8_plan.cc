#include "runtime/parallel/fp8_plan.h"

#include "runtime/core/error.h"
#include "runtime/nn/layers.h"

namespace fsdp {

Fp8Report apply_fp8(const std::vector<nn::Module*>& blocks, const Fp8Plan& plan) {
  FSDP_CHECK(plan.bf16_first_blocks >= 0 && plan.bf16_last_blocks >= 0, ConfigError,
             "fp8: the numbers of blocks kept in bf16 must not be negative");
  Fp8Report report;
  const int n = int(blocks.size());
  for (int i = 0; i < n; ++i) {
    nn::Module& block = *blocks[size_t(i)];
    if (i < plan.bf16_first_blocks || i >= n - plan.bf16_last_blocks) {
      report.bf16_blocks.push_back(block.name());
      continue;
    }
    for (nn::Module* m : block.modules()) {
      auto* linear = dynamic_cast<nn::Linear*>(m);
      if (!linear || linear->parallel_style() != nn::ParallelStyle::replicated) continue;
      linear->weight().fp8 = plan.recipe;
      linear->weight().fp8->token_group = plan.token_group;
      report.fp8_layers.push_back(linear->name());
      report.fp8_weights.push_back(&linear->weight());
    }
  }
  return report;
}

}  // namespace fsdp
