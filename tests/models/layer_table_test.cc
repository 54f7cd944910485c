// The models' layer tables (runtime/nn/layer_table.h): what the plans read instead of layer
// types. Every row names a module of a model that has that part, every product inside the
// blocks but the router has a style, and the lookup refuses ambiguous or mistyped tables.
#include <set>
#include <string>

#include "models/factory.h"
#include "runtime/nn/layer_table.h"
#include "runtime/nn/layers.h"
#include "runtime/nn/moe.h"
#include "tests/models/tiny_configs.h"
#include "tests/test_support.h"

namespace fsdp::models {
namespace {

using nn::LayerStyle;

TEST_CASE("layer patterns match dotted names component by component", "[models][layer_table]") {
  CHECK(nn::matches_layer_pattern("h.*.attn.qkv", "h.0.attn.qkv"));
  CHECK(nn::matches_layer_pattern("h.*.attn.qkv", "h.11.attn.qkv"));
  CHECK(nn::matches_layer_pattern("ln_f", "ln_f"));
  CHECK(nn::matches_layer_pattern("h.*", "h.3"));
  CHECK_FALSE(nn::matches_layer_pattern("h.*", "h"));
  CHECK_FALSE(nn::matches_layer_pattern("h.*", "h.3.attn"));
  CHECK_FALSE(nn::matches_layer_pattern("h.*.mlp.proj", "h.0.mlp.shared_expert.proj"));
  CHECK_FALSE(nn::matches_layer_pattern("h.*.attn", "h.0.attn_norm"));
  CHECK_FALSE(nn::matches_layer_pattern("*", ""));
  CHECK_FALSE(nn::matches_layer_pattern("ln_f", "ln_f.weight"));
}

TEST_CASE("each model's table names its layers, and every product in its blocks",
          "[models][layer_table]") {
  for (Family f : {Family::GPT2, Family::Llama}) {
    CAPTURE(family_name(f));
    auto model = build_model(tiny_moe(f));
    const nn::LayerTable table = model->layer_table();
    const std::vector<nn::StyledLayer> layers = table.resolve(*model);
    // Every row names at least one module of a model with every part.
    for (const nn::LayerRow& row : table.rows()) {
      CAPTURE(row.pattern);
      bool found = false;
      for (const nn::StyledLayer& l : layers) found = found || l.row == &row;
      CHECK(found);
    }
    std::set<const nn::Module*> styled;
    for (const nn::StyledLayer& l : layers) styled.insert(l.module);
    // The blocks, in forward order, are the model's blocks.
    std::vector<nn::Module*> blocks;
    for (const nn::StyledLayer& l : table.layers(*model, LayerStyle::block)) blocks.push_back(l.module);
    CHECK(blocks == model->blocks());
    // Every Linear inside a block but an MoE router (the layer computes it itself) is a
    // product the table styles; the attention and MoE layers and the norms too.
    std::set<const nn::Module*> routers;
    for (nn::MoELayer* moe : model->moe_layers()) routers.insert(&moe->router);
    CHECK(routers.size() == 2);
    int linears = 0;
    for (nn::Module* block : model->blocks())
      for (nn::Module* m : block->modules()) {
        CAPTURE(m->name());
        const std::string kind = m->kind();
        if (kind == "linear" && !routers.count(m)) {
          ++linears;
          CHECK(styled.count(m) == 1);
        }
        if (kind == "attention" || kind == "moe" || kind == "layernorm" || kind == "rmsnorm")
          CHECK(styled.count(m) == 1);
        if (routers.count(m)) CHECK(styled.count(m) == 0);
      }
    // Per layer: qkv and proj, then fc (or gate_up) and proj of the dense MLP or the shared
    // expert.
    CHECK(linears == 3 * 4);
    CHECK(table.layers(*model, LayerStyle::experts).size() == 2);
    CHECK(table.layers(*model, LayerStyle::final_norm).size() == 1);
    // The heads of column_heads rows make the fused layer's rows.
    for (const nn::StyledLayer& l : table.layers(*model, LayerStyle::column_heads)) {
      const nn::AttentionHeads& h = l.row->heads;
      auto& qkv = nn::styled_as<nn::Linear>(l, "Linear");
      CHECK(qkv.weight().shape()[0] == (h.n_head + 2 * h.n_kv_head) * h.head_dim);
    }
  }
}

TEST_CASE("a table naming one layer twice, or a style on the wrong type, is refused by name",
          "[models][layer_table]") {
  auto model = build_model(tiny_moe(Family::GPT2));
  const nn::LayerTable twice({{"h.*.attn.qkv", LayerStyle::column, "", 1, {}},
                              {"h.0.attn.*", LayerStyle::row, "", 1, {}}});
  CHECK_THROWS_WITH(twice.resolve(*model), Catch::Contains(
                                               "'h.0.attn.qkv' is named by two rows"));
  const nn::LayerTable wrong({{"h.*.ln_1", LayerStyle::experts, "", 1, {}}});
  const auto layers = wrong.resolve(*model);
  REQUIRE(layers.size() == 3);
  CHECK_THROWS_WITH(nn::styled_as<nn::MoELayer>(layers[0], "MoELayer"),
                    Catch::Contains(
                        "'h.0.ln_1' (kind \"layernorm\") has style experts, which needs a MoELayer"));
  // A kind narrows a row: only the MoE layers among the MLPs named "mlp".
  const nn::LayerTable moe({{"h.*.mlp", LayerStyle::experts, "moe", 1, {}}});
  const auto moes = moe.resolve(*model);
  REQUIRE(moes.size() == 2);
  CHECK(moes[0].module->name() == "h.0.mlp");
  CHECK(moes[1].module->name() == "h.2.mlp");
}

}  // namespace
}  // namespace fsdp::models
