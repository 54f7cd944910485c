// A model's layer table: which of its layers plays which part for the plans applied from
// outside it (tensor, context and expert parallelism, FP8), named by pattern, as
// torchtitan's per-model parallelize plans name theirs ("h.*.attn.qkv" -> column_heads).
// The plans read styles and never test layer types, so a new model states its table, and
// a new layer type made of Linears needs rows, not changes to the plans.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/nn/module.h"

namespace fsdp::nn {

enum class LayerStyle : uint8_t {
  // A transformer block: the blocks in forward order (FP8 keeps the first and last ones in
  // bf16); sequence parallelism splits the residual stream before the first one.
  block,
  // A norm inside a block: replicated; under sequence parallelism it sees only its rank's
  // tokens, so its gradient is a partial sum.
  norm,
  // The norm whose output feeds the head: as a norm, and where the head's input enters the
  // tensor-parallel region (or the sequence is gathered again).
  final_norm,
  // A Linear whose output features are split over the tensor-parallel group (its rows made
  // of `parts` equal parts, each split: [gate | up]). A product FP8 may run.
  column,
  // A fused [q heads | k heads | v heads] Linear, split by heads (`heads`; with fewer
  // key/value heads than ranks, each is replicated on the ranks sharing it). FP8 may run it.
  column_heads,
  // A Linear whose input features are split and whose output is summed over the group (its
  // bias whole, added after the sum). FP8 may run it.
  row,
  // A CausalSelfAttention: over the whole sequence under context parallelism.
  attention,
  // An MoELayer: its experts split under expert parallelism; under tensor parallelism run
  // whole on each rank's part of the sequence; its balancing loss over whole sequences
  // under context parallelism.
  experts,
};
const char* layer_style_name(LayerStyle style);

struct AttentionHeads {
  int64_t n_head = 0;     // H
  int64_t n_kv_head = 0;  // Hkv
  int64_t head_dim = 0;   // D
};

struct LayerRow {
  // A module's dotted name; '*' stands for any one component ("h.*.mlp.fc").
  std::string pattern;
  LayerStyle style = LayerStyle::block;
  // When set, only modules of this kind match (the MoE layers among dense MLPs of one name).
  std::string kind;
  int parts = 1;         // column
  AttentionHeads heads;  // column_heads
};

struct StyledLayer {
  Module* module = nullptr;
  const LayerRow* row = nullptr;
};

// Whether dotted `name` matches `pattern` component by component ('*' matches any one).
bool matches_layer_pattern(const std::string& pattern, const std::string& name);

class LayerTable {
 public:
  LayerTable() = default;
  explicit LayerTable(std::vector<LayerRow> rows) : rows_(std::move(rows)) {}
  const std::vector<LayerRow>& rows() const { return rows_; }

  // The modules of `root` some row names, in root.modules() order (parents before
  // children, in construction order), each with its row. ConfigError when two rows name
  // one module.
  std::vector<StyledLayer> resolve(Module& root) const;
  // Those of one style.
  std::vector<StyledLayer> layers(Module& root, LayerStyle style) const;

 private:
  std::vector<LayerRow> rows_;
};

// A styled layer's module as the type its style needs; ConfigError naming the module and
// the style when the table gave the style to a module of another type.
template <typename T>
T& styled_as(const StyledLayer& layer, const char* type_name) {
  T* m = dynamic_cast<T*>(layer.module);
  FSDP_CHECK(m != nullptr, ConfigError, "layer table: '", layer.module->name(), "' (kind \"",
             layer.module->kind(), "\") has style ", layer_style_name(layer.row->style),
             ", which needs a ", type_name);
  return *m;
}

}  // namespace fsdp::nn
