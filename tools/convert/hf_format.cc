#include "tools/convert/hf_format.h"

#include <nlohmann/json.hpp>

#include "runtime/core/error.h"

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
  // Refused rather than half-mapped: the experts' (E, ...) tensors have no rows here yet.
  FSDP_CHECK(!c.is_moe(), ConfigError, "the Hugging Face format of mixture-of-experts models "
             "(model.num_moe_experts ", c.num_moe_experts, ") is not mapped yet");
  return c.family == models::Family::GPT2 ? gpt2_tensors(c) : llama_tensors(c);
}

bool is_ignorable_hf_tensor(const std::string& name, const models::ModelConfig& c) {
  if (c.family == models::Family::GPT2)
    return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias") || name == "lm_head.weight";
  return ends_with(name, ".rotary_emb.inv_freq") || (c.tie_embeddings && name == "lm_head.weight");
}

std::string hf_config_json(const models::ModelConfig& c, const std::string& dtype_name) {
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
    j["architectures"] = Json::array({"LlamaForCausalLM"});
    j["model_type"] = "llama";
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.d_model;
    j["intermediate_size"] = c.d_ff;
    j["num_hidden_layers"] = c.n_layer;
    j["num_attention_heads"] = c.n_head;
    j["num_key_value_heads"] = c.n_kv_head;
    j["head_dim"] = c.head_dim();
    j["max_position_embeddings"] = c.seq_len;
    j["rms_norm_eps"] = c.norm_eps;
    j["rope_theta"] = c.rope_theta;
    j["rope_scaling"] = nullptr;
    j["hidden_act"] = "silu";
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
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
  } else if (type == "llama") {
    c.family = models::Family::Llama;
    c.n_layer = integer("num_hidden_layers");
    c.d_model = integer("hidden_size");
    c.n_head = integer("num_attention_heads");
    c.n_kv_head = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                      ? integer("num_key_value_heads")
                      : c.n_head;
    c.d_ff = integer("intermediate_size");
    c.vocab_size = integer("vocab_size");
    c.seq_len = integer("max_position_embeddings");
    c.norm_eps = number("rms_norm_eps", 1e-6);
    c.rope_theta = number("rope_theta", 10000.0);
    c.init_std = number("initializer_range", 0.02);
    c.tie_embeddings = flag("tie_word_embeddings", false);
    FSDP_CHECK(text("hidden_act", "silu") == "silu", ConfigError, source, ": hidden_act \"",
               text("hidden_act", ""), "\": fsdp.cpp's Llama uses SwiGLU (silu)");
    FSDP_CHECK(!flag("attention_bias", false), ConfigError, source,
               ": attention_bias true: fsdp.cpp's Llama has no attention biases");
    FSDP_CHECK(!flag("mlp_bias", false), ConfigError, source, ": mlp_bias true: fsdp.cpp's Llama has no MLP biases");
    FSDP_CHECK(!j.contains("rope_scaling") || j["rope_scaling"].is_null(), ConfigError, source,
               ": rope_scaling is set: fsdp.cpp implements plain RoPE only");
    if (j.contains("head_dim") && !j["head_dim"].is_null())
      FSDP_CHECK(integer("head_dim") * c.n_head == c.d_model, ConfigError, source, ": head_dim ",
                 integer("head_dim"), " is not hidden_size / num_attention_heads (", c.d_model, " / ",
                 c.n_head, "), which fsdp.cpp's attention assumes");
  } else {
    FSDP_THROW(ConfigError, source, ": model_type \"", type, "\" is not one fsdp.cpp implements (gpt2, llama)");
  }
  c.padded_vocab_size = padded_vocab_size;
  try {
    return c.resolved();
  } catch (const ConfigError& e) {
    FSDP_THROW(ConfigError, source, ": ", e.what());
  }
}

}  // namespace fsdp::convert
