// Hugging Face export and import of mixture-of-experts models as Mixtral. A tiny Llama-family
// MoE model (4 experts, top 2, expert hidden 24 beside width 32, so that a transposed or
// swapped cut has the wrong shape) maps to model.layers.<i>.block_sparse_moe.{gate,
// experts.<e>.{w1,w3,w2}}; its export holds each expert's rows bit for bit, imports back to
// the same weights bit for bit and re-exports to the same bytes. What Mixtral cannot express
// (our side) and what our layer cannot express (theirs) is refused naming the key.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "kernels/ops.h"
#include "models/factory.h"
#include "runtime/checkpoint/durable_files.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/checkpoint/sha256.h"
#include "runtime/fsdp/sharded_model.h"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/test_support.h"
#include "tools/convert/hf_export.h"
#include "tools/convert/hf_format.h"
#include "tools/convert/hf_import.h"

using namespace fsdp;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

constexpr int64_t kExperts = 4, kTopK = 2, kExpertHidden = 24, kWidth = 32;

// A Mixtral-shaped model: Llama family, every layer MoE, softmax scores renormalized over
// the top k, no shared expert, no expert bias. d_ff equals the experts' hidden size: a
// Mixtral's config.json has one intermediate_size, which an import gives to both.
models::ModelConfig mixtral_config() {
  models::ModelConfig c;
  c.family = models::Family::Llama;
  c.n_layer = 2;
  c.d_model = kWidth;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.d_ff = kExpertHidden;
  c.vocab_size = 96;
  c.padded_vocab_size = 128;
  c.seq_len = 16;
  c.tie_embeddings = false;
  c.num_moe_experts = kExperts;
  c.moe_router_topk = kTopK;
  c.moe_ffn_hidden_size = kExpertHidden;
  c.moe_aux_loss_coeff = 0.01;
  return c.resolved();
}

// The initial weights of model `c` (seeded, f32, full), by our names.
std::map<std::string, Tensor> initial_weights(Context& ctx, const models::ModelConfig& c) {
  auto model = models::build_model(c);
  FsdpOptions fo;
  fo.strategy = ShardingStrategy::NoShard;
  fo.compute_dtype = DType::f32;
  fo.main_dtype = DType::f32;
  fo.seed = 7;
  auto sharded = fully_shard(ctx, *model, DataParallelGroups(), fo);
  std::map<std::string, Tensor> out;
  for (int u = 0; u < sharded->num_units(); ++u) {
    const UnitPlan& plan = sharded->plan().units()[size_t(u)];
    Tensor full = ctx.empty(Shape{plan.padded_numel}, DType::f32);
    sharded->gather_full_weights(u, full);
    for (const ParamPlacement& p : plan.params)
      out[p.name] = ops::clone(ctx, full.narrow(0, p.offset, p.numel).view(p.shape));
  }
  return out;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), size_t(a.nbytes())) == 0;
}

// Expert e's rows [begin, begin + n) of our (E, R, K) parameter, as an (n, K) f32 copy.
Tensor expert_rows(Context& ctx, const Tensor& p, int64_t e, int64_t begin, int64_t n) {
  return ops::clone(ctx, p.select(0, e).narrow(0, begin, n));
}

const convert::HfTensor& find(const std::vector<convert::HfTensor>& ts, const std::string& name) {
  for (const convert::HfTensor& t : ts)
    if (t.name == name) return t;
  FAIL("no Hugging Face tensor " << name);
  return ts.front();
}

}  // namespace

TEST_CASE("a Mixtral-shaped model maps to Mixtral's per-expert tensors and config.json", "[checkpoint]") {
  const models::ModelConfig c = mixtral_config();
  const int64_t E = kExperts, F = kExpertHidden, C = kWidth;
  const std::vector<convert::HfTensor> ts = convert::hf_tensors(c);
  // embed, per layer (2 norms, q, k, v, o, gate, E x w1 w3 w2), norm, lm_head.
  CHECK(ts.size() == size_t(1 + 2 * (6 + 1 + 3 * E) + 2));

  const convert::HfTensor& gate = find(ts, "model.layers.1.block_sparse_moe.gate.weight");
  CHECK(gate.ours == "layers.1.mlp.router.weight");
  CHECK(gate.shape == Shape({E, C}));
  CHECK(gate.rows == E);
  // Expert 2's gate rows are rows [0, F) of gate_up[2], its up rows [F, 2F): rows
  // [2 * 2F, 2 * 2F + F) and [2 * 2F + F, 3 * 2F) of gate_up seen as (E * 2F, C).
  const convert::HfTensor& w1 = find(ts, "model.layers.1.block_sparse_moe.experts.2.w1.weight");
  const convert::HfTensor& w3 = find(ts, "model.layers.1.block_sparse_moe.experts.2.w3.weight");
  const convert::HfTensor& w2 = find(ts, "model.layers.1.block_sparse_moe.experts.3.w2.weight");
  CHECK(w1.ours == "layers.1.mlp.experts.gate_up");
  CHECK(w1.shape == Shape({F, C}));
  CHECK(w1.row_begin == 2 * 2 * F);
  CHECK(w3.ours == "layers.1.mlp.experts.gate_up");
  CHECK(w3.row_begin == 2 * 2 * F + F);
  CHECK(w3.rows == F);
  CHECK(w2.ours == "layers.1.mlp.experts.proj");
  CHECK(w2.shape == Shape({C, F}));
  CHECK(w2.row_begin == 3 * C);
  CHECK(w2.rows == C);
  for (const convert::HfTensor& t : ts) {
    CHECK_FALSE(t.transpose);
    CHECK(t.name.find("mlp.") == std::string::npos);  // no dense MLP left
  }

  // Every parameter is cut into row ranges that cover its rows once (the vocabulary's
  // padding rows aside), so export and import move every weight, none twice.
  Context ctx;
  auto model = models::build_model(c);
  std::map<std::string, std::vector<int>> covered;
  for (nn::Parameter* p : model->named_parameters())
    covered[p->name()].assign(size_t(convert::hf_rows(ops::zeros(ctx, p->shape(), DType::f32)).size(0)), 0);
  for (const convert::HfTensor& t : ts) {
    INFO(t.name);
    REQUIRE(covered.count(t.ours));
    REQUIRE(t.row_begin + t.rows <= int64_t(covered[t.ours].size()));
    CHECK(t.shape[0] == t.rows);
    for (int64_t r = t.row_begin; r < t.row_begin + t.rows; ++r) covered[t.ours][size_t(r)]++;
  }
  for (const auto& [name, rows] : covered) {
    INFO(name);
    const bool vocab = name == "embed.weight" || name == "lm_head.weight";
    for (size_t r = 0; r < rows.size(); ++r) REQUIRE(rows[r] == (vocab && int64_t(r) >= c.vocab_size ? 0 : 1));
  }
  CHECK(convert::hf_rows(ops::zeros(ctx, Shape{E, 2 * F, C}, DType::f32)).shape() == Shape({E * 2 * F, C}));

  // config.json: Mixtral's keys, and it reads back as the same model.
  const std::string text = convert::hf_config_json(c, "float32");
  const Json j = Json::parse(text);
  CHECK(j["architectures"][0] == "MixtralForCausalLM");
  CHECK(j["model_type"] == "mixtral");
  CHECK(j["num_local_experts"] == E);
  CHECK(j["num_experts_per_tok"] == kTopK);
  CHECK(j["intermediate_size"] == F);
  CHECK(j["head_dim"] == 8);
  CHECK(j["num_key_value_heads"] == 2);
  CHECK(j["router_aux_loss_coef"] == 0.01);
  CHECK(j["output_router_logits"] == false);
  CHECK(j["sliding_window"].is_null());
  CHECK(j["tie_word_embeddings"] == false);
  CHECK_FALSE(j.contains("attention_bias"));
  CHECK(convert::model_config_from_hf(text, "config.json").str() == c.str());
}

TEST_CASE("a Mixtral-shaped checkpoint exports and imports back bit for bit", "[checkpoint]") {
  const std::string dir = testing::shared_scratch_dir("hf_mixtral");
  Context ctx;
  const models::ModelConfig c = mixtral_config();
  convert::HfModel native;
  native.config = c;
  native.params = initial_weights(ctx, c);
  const Tensor& gate_up = native.params.at("layers.1.mlp.experts.gate_up");  // (E, 2F, C)
  const Tensor& proj = native.params.at("layers.0.mlp.experts.proj");        // (E, C, F)
  REQUIRE(gate_up.shape() == Shape({kExperts, 2 * kExpertHidden, kWidth}));
  // Distinct experts, so that a swap of experts (or of gate and up) would show.
  REQUIRE_FALSE(same_bytes(expert_rows(ctx, gate_up, 0, 0, kExpertHidden), expert_rows(ctx, gate_up, 1, 0, kExpertHidden)));
  // The vocabulary's padding rows are zero, as an import leaves them.
  for (const char* name : {"embed.weight", "lm_head.weight"})
    ops::copy(ctx, native.params.at(name).narrow(0, c.vocab_size, c.padded_vocab_size - c.vocab_size),
              ops::zeros(ctx, Shape{c.padded_vocab_size - c.vocab_size, kWidth}, DType::f32));
  convert::write_step0_checkpoint(ctx, native, dir + "/native");

  const models::ModelConfig exported = convert::export_hf(dir + "/native", dir + "/hf");
  CHECK(exported.str() == c.str());
  checkpoint::SafetensorsReader hf(dir + "/hf/model.safetensors");
  const std::string p = "model.layers.";
  CHECK(same_bytes(hf.load(ctx, p + "1.block_sparse_moe.experts.2.w1.weight"),
                   expert_rows(ctx, gate_up, 2, 0, kExpertHidden)));
  CHECK(same_bytes(hf.load(ctx, p + "1.block_sparse_moe.experts.2.w3.weight"),
                   expert_rows(ctx, gate_up, 2, kExpertHidden, kExpertHidden)));
  CHECK(same_bytes(hf.load(ctx, p + "0.block_sparse_moe.experts.3.w2.weight"),
                   expert_rows(ctx, proj, 3, 0, kWidth)));
  CHECK(same_bytes(hf.load(ctx, p + "0.block_sparse_moe.gate.weight"), native.params.at("layers.0.mlp.router.weight")));
  CHECK(hf.entries().size() == convert::hf_tensors(c).size());

  // The check batch: our f32 logits of the MoE model, finite.
  checkpoint::SafetensorsReader batch(dir + "/hf/fsdp_check_batch.safetensors");
  const Tensor logits = batch.load(ctx, "logits");
  CHECK(logits.shape() == Shape({2, 16, 96}));
  CHECK(std::isfinite(ops::item(ctx, ops::sum_squares(ctx, logits))));
  CHECK(ops::item(ctx, ops::max_abs(ctx, logits)) > 0);

  // Import: the same model, the same weights bit for bit; exported again, the same bytes.
  const convert::HfModel imported = convert::read_hf_model(ctx, dir + "/hf");
  CHECK(imported.config.str() == c.str());
  REQUIRE(imported.params.size() == native.params.size());
  for (const auto& [name, t] : native.params) {
    INFO(name);
    CHECK(same_bytes(imported.params.at(name), t));
  }
  convert::write_step0_checkpoint(ctx, imported, dir + "/imported");
  convert::ExportOptions o;
  o.check_batch = false;
  convert::export_hf(dir + "/imported", dir + "/hf2", o);
  CHECK(checkpoint::sha256_hex(checkpoint::read_text_file(dir + "/hf2/model.safetensors")) ==
        checkpoint::sha256_hex(checkpoint::read_text_file(dir + "/hf/model.safetensors")));
  CHECK(checkpoint::read_text_file(dir + "/hf2/config.json") == checkpoint::read_text_file(dir + "/hf/config.json"));

  // A Mixtral directory missing an expert's tensor, or holding one too many, is refused by name.
  auto rewrite = [&](const std::string& name, const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
    const std::string d = dir + "/" + name;
    fs::copy(dir + "/hf", d, fs::copy_options::recursive);
    std::vector<std::pair<std::string, Tensor>> ts;
    {
      checkpoint::SafetensorsReader r(d + "/model.safetensors");
      for (const auto& e : r.entries()) ts.emplace_back(e.name, r.load(ctx, e.name));
    }
    edit(ts);
    checkpoint::save_safetensors(ctx, d + "/model.safetensors", ts, {{"format", "pt"}});
    return d;
  };
  const std::string w2 = p + "1.block_sparse_moe.experts.3.w2.weight";
  const std::string missing = rewrite("missing", [&](auto& ts) {
    for (size_t i = 0; i < ts.size(); ++i)
      if (ts[i].first == w2) ts.erase(ts.begin() + long(i));
  });
  CHECK_THROWS_WITH(convert::read_hf_model(ctx, missing), Contains("\"" + w2 + "\" is missing"));
  const std::string extra = rewrite("extra", [&](auto& ts) {
    ts.emplace_back(p + "1.block_sparse_moe.experts.4.w1.weight", ops::zeros(ctx, Shape{kExpertHidden, kWidth}, DType::f32));
  });
  CHECK_THROWS_WITH(convert::read_hf_model(ctx, extra),
                    Contains("\"model.layers.1.block_sparse_moe.experts.4.w1.weight\" is not part of a mixtral model"));
}

TEST_CASE("MoE models that Mixtral cannot express are refused naming the key", "[checkpoint]") {
  const models::ModelConfig good = mixtral_config();
  auto refused = [&](const std::function<void(models::ModelConfig&)>& edit, const std::string& message) {
    models::ModelConfig c = good;
    edit(c);
    c = c.resolved();
    INFO(message);
    CHECK_THROWS_AS(convert::hf_tensors(c), ConfigError);
    CHECK_THROWS_WITH(convert::hf_tensors(c), Contains(message));
    CHECK_THROWS_WITH(convert::hf_config_json(c, "float32"), Contains(message));
  };
  refused([](auto& c) { c.family = models::Family::GPT2; c.n_kv_head = 0; c.tie_embeddings = true; },
          "model.family gpt2 with model.num_moe_experts 4");
  refused([](auto& c) { c.moe_shared_expert_intermediate_size = 16; }, "model.moe_shared_expert_intermediate_size 16");
  refused([](auto& c) { c.moe_router_score_function = "sigmoid"; }, "model.moe_router_score_function sigmoid");
  refused([](auto& c) { c.moe_router_normalize = false; }, "model.moe_router_normalize false");
  refused([](auto& c) { c.moe_router_normalize = false; }, "q/k norms");
  refused([](auto& c) { c.moe_router_enable_expert_bias = true; }, "model.moe_router_enable_expert_bias true");
  refused([](auto& c) { c.moe_layer_freq = 2; }, "model.moe_layer_freq 2");
  refused([](auto& c) { c.moe_first_k_dense_replace = 1; }, "model.moe_first_k_dense_replace 1");

  // An export of such a checkpoint writes nothing.
  const std::string dir = testing::shared_scratch_dir("hf_mixtral_refused");
  Context ctx;
  models::ModelConfig shared = good;
  shared.moe_shared_expert_intermediate_size = 16;
  shared = shared.resolved();
  convert::HfModel m;
  m.config = shared;
  m.params = initial_weights(ctx, shared);
  convert::write_step0_checkpoint(ctx, m, dir + "/native");
  CHECK_THROWS_WITH(convert::export_hf(dir + "/native", dir + "/hf"), Contains("moe_shared_expert_intermediate_size"));
  CHECK_FALSE(fs::exists(dir + "/hf"));
}

TEST_CASE("Mixtral configs that fsdp.cpp's MoE layer cannot express are refused naming the key", "[checkpoint]") {
  const Json good = Json::parse(convert::hf_config_json(mixtral_config(), "bfloat16"));
  auto read = [&](const std::function<void(Json&)>& edit) {
    Json j = good;
    edit(j);
    return convert::model_config_from_hf(j.dump(), "mixtral/config.json");
  };
  auto refused = [&](const std::function<void(Json&)>& edit, const std::string& message) {
    INFO(message);
    CHECK_THROWS_AS(read(edit), ConfigError);
    CHECK_THROWS_WITH(read(edit), Contains("mixtral/config.json") && Contains(message));
  };
  refused([](Json& j) { j["sliding_window"] = 8; }, "sliding_window 8");
  refused([](Json& j) { j["router_jitter_noise"] = 0.01; }, "router_jitter_noise");
  refused([](Json& j) { j["hidden_act"] = "gelu"; }, "hidden_act \"gelu\"");
  refused([](Json& j) { j["rope_scaling"] = Json{{"type", "linear"}, {"factor", 2.0}}; }, "rope_scaling");
  refused([](Json& j) { j["rope_parameters"] = Json{{"rope_type", "llama3"}}; }, "rope_parameters.rope_type \"llama3\"");
  refused([](Json& j) { j["head_dim"] = 16; }, "head_dim 16");
  refused([](Json& j) { j["num_experts_per_tok"] = 5; }, "model.moe_router_topk");
  refused([](Json& j) { j["model_type"] = "qwen3_moe"; }, "model_type \"qwen3_moe\"");
  refused([](Json& j) { j["model_type"] = "qwen3_moe"; }, "q_norm");
  refused([](Json& j) { j["model_type"] = "qwen2_moe"; }, "shared expert");

  // Accepted: a window no sequence reaches, transformers 5's rope_parameters, and
  // MixtralConfig's defaults for the keys a config.json leaves out.
  CHECK(read([](Json& j) { j["sliding_window"] = 16; }).str() == mixtral_config().str());
  CHECK(read([](Json& j) { j["rope_parameters"] = Json{{"rope_type", "default"}, {"rope_theta", 5e5}}; }).rope_theta == 5e5);
  const models::ModelConfig defaults = read([](Json& j) {
    for (const char* key : {"rope_theta", "rms_norm_eps", "num_experts_per_tok", "router_aux_loss_coef"}) j.erase(key);
  });
  CHECK(defaults.rope_theta == 1e6);
  CHECK(defaults.norm_eps == 1e-5);
  CHECK(defaults.moe_router_topk == 2);
  CHECK(defaults.moe_aux_loss_coeff == 0.001);
  CHECK(defaults.is_moe_layer(0));
  CHECK(defaults.is_moe_layer(1));
}
