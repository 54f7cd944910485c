#include "tools/convert/hf_format.h"

#include <map>

#include <nlohmann/json.hpp>

#include "runtime/core/error.h"
#include "runtime/core/json_depth.h"

namespace fsdp::convert {
namespace {

using Json = nlohmann::ordered_json;

// A tensor copied whole (or its first `rows` rows) from one of ours.
HfTensor whole(const std::string& name, const std::string& ours, const Shape& shape) {
  return HfTensor{name, shape, ours, 0, shape.rank() ? shape[0] : 1, false};
}
// A Conv1D weight: ours (out, in) stored as (in, out).
HfTensor transposed(const std::string& name, const std::string& ours, int64_t out, int64_t in) {
  return HfTensor{name, Shape{in, out}, ours, 0, out, true};
}
// Rows [begin, begin + rows) of one of ours.
HfTensor row_block(const std::string& name, const std::string& ours, int64_t begin, int64_t rows,
                   int64_t cols) {
  return HfTensor{name, Shape{rows, cols}, ours, begin, rows, false};
}

std::vector<HfTensor> gpt2_tensors(const models::ModelConfig& c) {
  const int64_t C = c.d_model, F = c.d_ff, V = c.vocab_size;
  std::vector<HfTensor> t;
  t.push_back(whole("transformer.wte.weight", "wte.weight", Shape{V, C}));
  t.push_back(whole("transformer.wpe.weight", "wpe.weight", Shape{c.seq_len, C}));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string hf = "transformer.h." + std::to_string(i) + ".";
    const std::string ours = "h." + std::to_string(i) + ".";
    t.push_back(whole(hf + "ln_1.weight", ours + "ln_1.weight", Shape{C}));
    t.push_back(whole(hf + "ln_1.bias", ours + "ln_1.bias", Shape{C}));
    t.push_back(transposed(hf + "attn.c_attn.weight", ours + "attn.qkv.weight", 3 * C, C));
    t.push_back(whole(hf + "attn.c_attn.bias", ours + "attn.qkv.bias", Shape{3 * C}));
    t.push_back(transposed(hf + "attn.c_proj.weight", ours + "attn.proj.weight", C, C));
    t.push_back(whole(hf + "attn.c_proj.bias", ours + "attn.proj.bias", Shape{C}));
    t.push_back(whole(hf + "ln_2.weight", ours + "ln_2.weight", Shape{C}));
    t.push_back(whole(hf + "ln_2.bias", ours + "ln_2.bias", Shape{C}));
    t.push_back(transposed(hf + "mlp.c_fc.weight", ours + "mlp.fc.weight", F, C));
    t.push_back(whole(hf + "mlp.c_fc.bias", ours + "mlp.fc.bias", Shape{F}));
    t.push_back(transposed(hf + "mlp.c_proj.weight", ours + "mlp.proj.weight", C, F));
    t.push_back(whole(hf + "mlp.c_proj.bias", ours + "mlp.proj.bias", Shape{C}));
  }
  t.push_back(whole("transformer.ln_f.weight", "ln_f.weight", Shape{C}));
  t.push_back(whole("transformer.ln_f.bias", "ln_f.bias", Shape{C}));
  return t;
}

// Why `c`, an MoE model, is not a Mixtral, as a ConfigError naming the key and its value.
// Each refusal says what Mixtral computes instead, so that nobody exports a model that
// transformers would run differently.
void check_mixtral(const models::ModelConfig& c) {
  FSDP_CHECK(c.family == models::Family::Llama, ConfigError, "model.family ", models::family_name(c.family),
             " with model.num_moe_experts ", c.num_moe_experts, ": transformers has no GPT-2 "
             "mixture-of-experts model (GELU experts, biases, learned positions); only Llama-family "
             "MoE models export, as Mixtral");
  FSDP_CHECK(c.moe_shared_expert_intermediate_size == 0, ConfigError,
             "model.moe_shared_expert_intermediate_size ", c.moe_shared_expert_intermediate_size,
             ": Mixtral has no shared expert (Qwen2-MoE's is scaled by a sigmoid gate that ours lacks)");
  FSDP_CHECK(c.moe_router_score_function == "softmax", ConfigError, "model.moe_router_score_function ",
             c.moe_router_score_function, ": Mixtral's router scores are a softmax over the experts");
  FSDP_CHECK(c.moe_router_normalize, ConfigError, "model.moe_router_normalize false: Mixtral "
             "renormalizes its top-k softmax weights (Qwen3-MoE's and OLMoE's norm_topk_prob false "
             "would not, but their attention has q/k norms that fsdp.cpp's attention lacks)");
  FSDP_CHECK(!c.moe_router_enable_expert_bias, ConfigError, "model.moe_router_enable_expert_bias true: "
             "Mixtral's router chooses experts by their scores alone, without a selection bias");
  FSDP_CHECK(c.moe_layer_freq == 1, ConfigError, "model.moe_layer_freq ", c.moe_layer_freq,
             ": every Mixtral layer is an MoE layer, so dense layers between them cannot be expressed");
  FSDP_CHECK(c.moe_first_k_dense_replace == 0, ConfigError, "model.moe_first_k_dense_replace ",
             c.moe_first_k_dense_replace, ": every Mixtral layer is an MoE layer, so dense first "
             "layers cannot be expressed");
}

// Mixtral's block_sparse_moe of layer `ours` (layers.<i>.mlp): the router, then every
// expert's w1 and w3 (cut from experts.gate_up (E, 2F, C) = [gate; up] per expert), then
// every expert's w2 (experts.proj (E, C, F)), so that each parameter is read once.
void mixtral_moe_tensors(const models::ModelConfig& c, const std::string& hf, const std::string& ours,
                         std::vector<HfTensor>& t) {
  const int64_t C = c.d_model, E = c.num_moe_experts, F = c.moe_ffn_hidden_size;
  t.push_back(whole(hf + "gate.weight", ours + "router.weight", Shape{E, C}));
  for (int64_t e = 0; e < E; ++e) {
    const std::string expert = hf + "experts." + std::to_string(e) + ".";
    t.push_back(row_block(expert + "w1.weight", ours + "experts.gate_up", e * 2 * F, F, C));
    t.push_back(row_block(expert + "w3.weight", ours + "experts.gate_up", e * 2 * F + F, F, C));
  }
  for (int64_t e = 0; e < E; ++e)
    t.push_back(row_block(hf + "experts." + std::to_string(e) + ".w2.weight", ours + "experts.proj",
                          e * C, C, F));
}

std::vector<HfTensor> llama_tensors(const models::ModelConfig& c) {
  const int64_t C = c.d_model, F = c.d_ff, V = c.vocab_size, D = c.head_dim();
  const int64_t q = c.n_head * D, kv = c.n_kv_head * D;
  std::vector<HfTensor> t;
  t.push_back(whole("model.embed_tokens.weight", "embed.weight", Shape{V, C}));
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string hf = "model.layers." + std::to_string(i) + ".";
    const std::string ours = "layers." + std::to_string(i) + ".";
    t.push_back(whole(hf + "input_layernorm.weight", ours + "attn_norm.weight", Shape{C}));
    t.push_back(row_block(hf + "self_attn.q_proj.weight", ours + "attn.qkv.weight", 0, q, C));
    t.push_back(row_block(hf + "self_attn.k_proj.weight", ours + "attn.qkv.weight", q, kv, C));
    t.push_back(row_block(hf + "self_attn.v_proj.weight", ours + "attn.qkv.weight", q + kv, kv, C));
    t.push_back(whole(hf + "self_attn.o_proj.weight", ours + "attn.proj.weight", Shape{C, q}));
    t.push_back(whole(hf + "post_attention_layernorm.weight", ours + "mlp_norm.weight", Shape{C}));
    if (c.is_moe_layer(i)) {
      mixtral_moe_tensors(c, hf + "block_sparse_moe.", ours + "mlp.", t);
      continue;
    }
    t.push_back(row_block(hf + "mlp.gate_proj.weight", ours + "mlp.gate_up.weight", 0, F, C));
    t.push_back(row_block(hf + "mlp.up_proj.weight", ours + "mlp.gate_up.weight", F, F, C));
    t.push_back(whole(hf + "mlp.down_proj.weight", ours + "mlp.proj.weight", Shape{C, F}));
  }
  t.push_back(whole("model.norm.weight", "norm.weight", Shape{C}));
  if (!c.tie_embeddings) t.push_back(whole("lm_head.weight", "lm_head.weight", Shape{V, C}));
  return t;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::vector<HfTensor> hf_tensors(const models::ModelConfig& c) {
  if (c.is_moe()) check_mixtral(c);
  return c.family == models::Family::GPT2 ? gpt2_tensors(c) : llama_tensors(c);
}

Tensor hf_rows(const Tensor& parameter) {
  if (parameter.dim() <= 2) return parameter;
  const int64_t cols = parameter.size(-1);
  return parameter.view(Shape{parameter.numel() / cols, cols});
}

bool is_ignorable_hf_tensor(const std::string& name, const models::ModelConfig& c) {
  if (c.family == models::Family::GPT2)
    return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias") || name == "lm_head.weight";
  return ends_with(name, ".rotary_emb.inv_freq") || (c.tie_embeddings && name == "lm_head.weight");
}

std::string hf_config_json(const models::ModelConfig& c, const std::string& dtype_name) {
  if (c.is_moe()) check_mixtral(c);  // the only MoE architecture written
  Json j;
  if (c.family == models::Family::GPT2) {
    j["architectures"] = Json::array({"GPT2LMHeadModel"});
    j["model_type"] = "gpt2";
    j["vocab_size"] = c.vocab_size;
    j["n_positions"] = c.seq_len;
    j["n_ctx"] = c.seq_len;
    j["n_embd"] = c.d_model;
    j["n_layer"] = c.n_layer;
    j["n_head"] = c.n_head;
    j["n_inner"] = c.d_ff;
    j["activation_function"] = "gelu_new";  // the tanh approximation, as ours
    j["layer_norm_epsilon"] = c.norm_eps;
    j["initializer_range"] = c.init_std;
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["attn_pdrop"] = 0.0;
    j["scale_attn_weights"] = true;
    j["tie_word_embeddings"] = true;
    if (c.vocab_size == 50257) {
      j["bos_token_id"] = 50256;
      j["eos_token_id"] = 50256;
    }
  } else {
    // Llama, or Mixtral for an MoE model: the same attention and norms.
    const bool moe = c.is_moe();
    j["architectures"] = Json::array({moe ? "MixtralForCausalLM" : "LlamaForCausalLM"});
    j["model_type"] = moe ? "mixtral" : "llama";
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.d_model;
    j["intermediate_size"] = moe ? c.moe_ffn_hidden_size : c.d_ff;  // Mixtral: each expert's
    j["num_hidden_layers"] = c.n_layer;
    j["num_attention_heads"] = c.n_head;
    j["num_key_value_heads"] = c.n_kv_head;
    j["head_dim"] = c.head_dim();
    j["max_position_embeddings"] = c.seq_len;
    j["rms_norm_eps"] = c.norm_eps;
    j["rope_theta"] = c.rope_theta;
    j["rope_scaling"] = nullptr;
    j["hidden_act"] = "silu";
    if (moe) {
      j["num_local_experts"] = c.num_moe_experts;
      j["num_experts_per_tok"] = c.moe_router_topk;
      // The balancing loss's weight, for training only (with output_router_logits). Carried
      // as it is: transformers' loss pools every layer's tokens and counts each of the k
      // choices of a token as a whole token, so it is not our per-layer loss numerically.
      j["router_aux_loss_coef"] = c.moe_aux_loss_coeff;
      j["output_router_logits"] = false;
      j["router_jitter_noise"] = 0.0;
      j["sliding_window"] = nullptr;  // full causal attention, as ours
    } else {
      j["attention_bias"] = false;
      j["mlp_bias"] = false;
    }
    j["attention_dropout"] = 0.0;
    j["initializer_range"] = c.init_std;
    j["tie_word_embeddings"] = c.tie_embeddings;
  }
  j["torch_dtype"] = dtype_name;
  j["use_cache"] = true;
  return j.dump(2) + "\n";
}

models::ModelConfig model_config_from_hf(const std::string& config_json, const std::string& source,
                                         int64_t padded_vocab_size) {
  check_json_depth<ConfigError>(config_json, source);
  Json j;
  try {
    j = Json::parse(config_json);
  } catch (const Json::exception& e) {
    FSDP_THROW(ConfigError, source, ": not valid JSON (", e.what(), ")");
  }
  auto get = [&](const char* key) -> const Json& {
    auto it = j.find(key);
    FSDP_CHECK(it != j.end() && !it->is_null(), ConfigError, source, ": missing \"", key, "\"");
    return *it;
  };
  auto integer = [&](const char* key) {
    const Json& v = get(key);
    FSDP_CHECK(v.is_number_integer(), ConfigError, source, ": \"", key, "\" must be an integer");
    return v.get<int64_t>();
  };
  auto integer_or = [&](const char* key, int64_t fallback) {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? fallback : integer(key);
  };
  auto number = [&](const char* key, double fallback) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    FSDP_CHECK(it->is_number(), ConfigError, source, ": \"", key, "\" must be a number");
    return it->get<double>();
  };
  auto text = [&](const char* key, const std::string& fallback) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    FSDP_CHECK(it->is_string(), ConfigError, source, ": \"", key, "\" must be a string");
    return it->get<std::string>();
  };
  auto flag = [&](const char* key, bool fallback) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    FSDP_CHECK(it->is_boolean(), ConfigError, source, ": \"", key, "\" must be true or false");
    return it->get<bool>();
  };

  models::ModelConfig c;
  const std::string type = text("model_type", "");
  if (type == "gpt2") {
    c.family = models::Family::GPT2;
    c.n_layer = integer("n_layer");
    c.d_model = integer("n_embd");
    c.n_head = integer("n_head");
    c.d_ff = j.contains("n_inner") && !j["n_inner"].is_null() ? integer("n_inner") : 4 * c.d_model;
    c.vocab_size = integer("vocab_size");
    c.seq_len = integer("n_positions");
    c.norm_eps = number("layer_norm_epsilon", 1e-5);
    c.init_std = number("initializer_range", 0.02);
    const std::string act = text("activation_function", "gelu_new");
    FSDP_CHECK(act == "gelu_new" || act == "gelu_pytorch_tanh", ConfigError, source,
               ": activation_function \"", act, "\": fsdp.cpp's GPT-2 uses the tanh GELU (gelu_new)");
    FSDP_CHECK(flag("tie_word_embeddings", true), ConfigError, source,
               ": tie_word_embeddings false: fsdp.cpp's GPT-2 head is always tied");
    c.tie_embeddings = true;
  } else if (type == "llama" || type == "mixtral") {
    // Mixtral is Llama's attention and norms with MoE MLPs; where a key is missing, each
    // reads transformers' default for its own model_type.
    const bool mixtral = type == "mixtral";
    c.family = models::Family::Llama;
    c.n_layer = integer("num_hidden_layers");
    c.d_model = integer("hidden_size");
    c.n_head = integer("num_attention_heads");
    c.n_kv_head = integer_or("num_key_value_heads", mixtral ? 8 : c.n_head);
    c.d_ff = integer("intermediate_size");
    c.vocab_size = integer("vocab_size");
    c.seq_len = integer("max_position_embeddings");
    c.norm_eps = number("rms_norm_eps", mixtral ? 1e-5 : 1e-6);
    c.rope_theta = number("rope_theta", mixtral ? 1e6 : 10000.0);
    c.init_std = number("initializer_range", 0.02);
    c.tie_embeddings = flag("tie_word_embeddings", false);
    FSDP_CHECK(text("hidden_act", "silu") == "silu", ConfigError, source, ": hidden_act \"",
               text("hidden_act", ""), "\": fsdp.cpp's Llama uses SwiGLU (silu)");
    FSDP_CHECK(!flag("attention_bias", false), ConfigError, source,
               ": attention_bias true: fsdp.cpp's Llama has no attention biases");
    FSDP_CHECK(!flag("mlp_bias", false), ConfigError, source, ": mlp_bias true: fsdp.cpp's Llama has no MLP biases");
    FSDP_CHECK(!j.contains("rope_scaling") || j["rope_scaling"].is_null(), ConfigError, source,
               ": rope_scaling is set: fsdp.cpp implements plain RoPE only");
    // transformers 5 saves the rotary settings as rope_parameters {rope_type, rope_theta}.
    if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
      const Json& rope = j["rope_parameters"];
      FSDP_CHECK(rope.is_object(), ConfigError, source, ": \"rope_parameters\" must be an object");
      std::string rope_type = "default";
      for (const char* key : {"rope_type", "type"}) {
        if (!rope.contains(key)) continue;
        FSDP_CHECK(rope[key].is_string(), ConfigError, source, ": \"rope_parameters.", key,
                   "\" must be a string");
        rope_type = rope[key].get<std::string>();
        break;
      }
      FSDP_CHECK(rope_type == "default", ConfigError, source, ": rope_parameters.rope_type \"", rope_type,
                 "\": fsdp.cpp implements plain RoPE only");
      if (rope.contains("rope_theta")) {
        FSDP_CHECK(rope["rope_theta"].is_number(), ConfigError, source,
                   ": \"rope_parameters.rope_theta\" must be a number");
        c.rope_theta = rope["rope_theta"].get<double>();
      }
    }
    if (j.contains("head_dim") && !j["head_dim"].is_null())
      FSDP_CHECK(integer("head_dim") * c.n_head == c.d_model, ConfigError, source, ": head_dim ",
                 integer("head_dim"), " is not hidden_size / num_attention_heads (", c.d_model, " / ",
                 c.n_head, "), which fsdp.cpp's attention assumes");
    if (mixtral) {
      // Mixtral's router: a softmax over every expert, the top k, their weights renormalized
      // to sum to 1; every layer is MoE; no shared expert, no selection bias.
      c.num_moe_experts = integer_or("num_local_experts", 8);
      c.moe_router_topk = integer_or("num_experts_per_tok", 2);
      c.moe_ffn_hidden_size = c.d_ff;
      c.moe_router_score_function = "softmax";
      c.moe_router_normalize = true;
      c.moe_router_load_balancing_type = "aux_loss";
      c.moe_aux_loss_coeff = number("router_aux_loss_coef", 0.001);
      FSDP_CHECK(number("router_jitter_noise", 0.0) == 0.0, ConfigError, source, ": router_jitter_noise ",
                 number("router_jitter_noise", 0.0), ": fsdp.cpp's router does not jitter its input");
      // A window at least as long as every sequence the model takes never cuts attention.
      if (j.contains("sliding_window") && !j["sliding_window"].is_null())
        FSDP_CHECK(integer("sliding_window") >= c.seq_len, ConfigError, source, ": sliding_window ",
                   integer("sliding_window"), " (max_position_embeddings ", c.seq_len,
                   "): fsdp.cpp's attention sees every earlier token, it has no sliding window");
    }
  } else {
    // The mixture-of-experts models a reader may try, with what keeps them out.
    const std::map<std::string, std::string> why = {
        {"qwen3_moe", "its attention normalizes q and k per head (q_norm, k_norm), which fsdp.cpp's does not"},
        {"olmoe", "its attention normalizes q and k (q_norm, k_norm), which fsdp.cpp's does not"},
        {"qwen2_moe", "its shared expert is scaled by a sigmoid gate that fsdp.cpp's lacks"},
    };
    auto reason = why.find(type);
    FSDP_THROW(ConfigError, source, ": model_type \"", type, "\" is not one fsdp.cpp implements (gpt2, "
               "llama, mixtral)", reason != why.end() ? ": " + reason->second : std::string());
  }
  c.padded_vocab_size = padded_vocab_size;
  try {
    return c.resolved();
  } catch (const ConfigError& e) {
    FSDP_THROW(ConfigError, source, ": ", e.what());
  }
}

}  // namespace fsdp::convert
