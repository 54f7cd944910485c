#include "runtime/parallel/fp8_plan.h"

#include "runtime/core/error.h"
#include "runtime/nn/layers.h"

namespace fsdp {

namespace {

// Whether some of the layer's weight rows are held by several tensor-parallel ranks.
bool replicates_rows(nn::Linear& linear) {
  const auto& slice = linear.weight().parallel_slice();
  if (!slice) return false;
  for (size_t i = 0; i < slice->ranges.size(); ++i)
    if (slice->replicas_of(i) > 1) return true;
  return false;
}

// The operands a tensor-parallel split divides along their features.
void mark_split_operands(nn::Linear& linear, nn::Fp8Recipe& r) {
  using nn::Fp8Operand;
  const nn::ParallelStyle style = linear.parallel_style();
  if (style == nn::ParallelStyle::replicated) return;
  using nn::Fp8Split;
  r.feature_group = linear.parallel_group();
  if (style == nn::ParallelStyle::column) {  // output features: W's rows, dy's columns
    r.split[size_t(Fp8Operand::weight)] = Fp8Split::rows;
    r.split[size_t(Fp8Operand::output_grad)] = Fp8Split::columns;
  } else {  // input features: W's and x's columns
    r.split[size_t(Fp8Operand::weight)] = Fp8Split::columns;
    r.split[size_t(Fp8Operand::input)] = Fp8Split::columns;
  }
}

}  // namespace

Fp8Report apply_fp8(nn::Module& model, const nn::LayerTable& table, const Fp8Plan& plan,
                    nn::Parameter* head) {
  FSDP_CHECK(plan.bf16_first_blocks >= 0 && plan.bf16_last_blocks >= 0, ConfigError,
             "fp8: the numbers of blocks kept in bf16 must not be negative");
  Fp8Report report;
  const std::vector<nn::StyledLayer> layers = table.resolve(model);
  std::vector<const nn::Module*> blocks;
  for (const nn::StyledLayer& l : layers)
    if (l.row->style == nn::LayerStyle::block) blocks.push_back(l.module);
  const int n = int(blocks.size());
  // The block a layer lies in: the one whose name prefixes its own.
  auto block_of = [&](const nn::Module& m) {
    for (int i = 0; i < n; ++i)
      if (m.name().rfind(blocks[size_t(i)]->name() + ".", 0) == 0) return i;
    return -1;
  };
  for (int i = 0; i < n; ++i)
    if (i < plan.bf16_first_blocks || i >= n - plan.bf16_last_blocks)
      report.bf16_blocks.push_back(blocks[size_t(i)]->name());
  for (const nn::StyledLayer& l : layers) {
    const nn::LayerStyle style = l.row->style;
    if (style != nn::LayerStyle::column && style != nn::LayerStyle::column_heads &&
        style != nn::LayerStyle::row)
      continue;
    const int b = block_of(*l.module);
    if (b < 0 || b < plan.bf16_first_blocks || b >= n - plan.bf16_last_blocks) continue;
    auto& linear = nn::styled_as<nn::Linear>(l, "Linear");
    if (replicates_rows(linear)) {
      report.bf16_layers.push_back(linear.name() + " (replicated key/value heads)");
      continue;
    }
    nn::Fp8Recipe& r = linear.weight().fp8.emplace(nn::Fp8Weight{plan.recipe}).recipe;
    r.token_group = plan.token_group;
    mark_split_operands(linear, r);
    report.fp8_layers.push_back(linear.name());
    report.fp8_weights.push_back(&linear.weight());
  }
  if (plan.classifier) {
    FSDP_CHECK(head != nullptr, ConfigError, "fp8: the plan puts the classifier in FP8 but no "
               "head weight was given");
    // The layer's name: the weight's full name without its local one ("lm_head.weight").
    const std::string& name = head->name();
    const size_t local = head->local_name().size() + 1;
    const std::string layer = name.size() > local ? name.substr(0, name.size() - local) : name;
    if (head->placement().vocabulary_group) {
      // Its logits' softmax spans the ranks' vocabulary slices (nn::classifier_loss).
      report.bf16_layers.push_back(layer + " (vocabulary-parallel)");
    } else {
      nn::Fp8Recipe& r = head->fp8.emplace(nn::Fp8Weight{plan.recipe}).recipe;
      r.token_group = plan.token_group;
      report.fp8_layers.push_back(layer);
      report.fp8_weights.push_back(head);
      report.classifier = layer;
    }
  }
  return report;
}

}  // namespace fsdp
