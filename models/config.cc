#include "models/config.h"

#include "runtime/core/error.h"

namespace fsdp::models {

const char* family_name(Family f) { return f == Family::GPT2 ? "gpt2" : "llama"; }

Family family_from_name(const std::string& name) {
  if (name == "gpt2") return Family::GPT2;
  if (name == "llama") return Family::Llama;
  FSDP_THROW(ConfigError, "model family '", name, "' is not one of: gpt2, llama");
}

namespace {

// The mixture-of-experts keys, after d_ff is resolved (moe_ffn_hidden_size defaults to it).
void check_moe(ModelConfig& c) {
  FSDP_CHECK(c.num_moe_experts >= 0 && c.num_moe_experts <= 65536, ConfigError,
             "model.num_moe_experts must be in [0, 65536] (0 = dense), got ", c.num_moe_experts);
  FSDP_CHECK(c.moe_router_score_function == "softmax" || c.moe_router_score_function == "sigmoid",
             ConfigError, "model.moe_router_score_function '", c.moe_router_score_function,
             "' is not one of: softmax, sigmoid");
  const std::string& lb = c.moe_router_load_balancing_type;
  FSDP_CHECK(lb == "aux_loss" || lb == "seq_aux_loss" || lb == "none", ConfigError,
             "model.moe_router_load_balancing_type '", lb,
             "' is not one of: aux_loss, seq_aux_loss, none");
  FSDP_CHECK(c.moe_aux_loss_coeff >= 0, ConfigError, "model.moe_aux_loss_coeff must be >= 0, got ",
             c.moe_aux_loss_coeff);
  FSDP_CHECK(c.moe_z_loss_coeff >= 0, ConfigError, "model.moe_z_loss_coeff must be >= 0, got ",
             c.moe_z_loss_coeff);
  FSDP_CHECK(c.moe_layer_freq >= 1, ConfigError, "model.moe_layer_freq must be >= 1, got ",
             c.moe_layer_freq);
  FSDP_CHECK(c.moe_first_k_dense_replace >= 0, ConfigError,
             "model.moe_first_k_dense_replace must be >= 0, got ", c.moe_first_k_dense_replace);
  FSDP_CHECK(c.moe_shared_expert_intermediate_size >= 0, ConfigError,
             "model.moe_shared_expert_intermediate_size must be >= 0, got ",
             c.moe_shared_expert_intermediate_size);
  if (!c.is_moe()) return;
  if (c.moe_ffn_hidden_size == 0) c.moe_ffn_hidden_size = c.d_ff;
  FSDP_CHECK(c.moe_ffn_hidden_size >= 1 && c.moe_ffn_hidden_size <= kMaxWidth * 8, ConfigError,
             "model.moe_ffn_hidden_size must be in [1, ", kMaxWidth * 8, "] with experts, got ",
             c.moe_ffn_hidden_size);
  FSDP_CHECK(c.moe_router_topk >= 1 && c.moe_router_topk <= c.num_moe_experts, ConfigError,
             "model.moe_router_topk (", c.moe_router_topk, ") must be in [1, model.num_moe_experts = ",
             c.num_moe_experts, "]");
  FSDP_CHECK(c.num_moe_layers() > 0, ConfigError, "model.num_moe_experts is ", c.num_moe_experts,
             " but no layer is an MoE layer (model.moe_first_k_dense_replace ",
             c.moe_first_k_dense_replace, ", model.n_layer ", c.n_layer, ")");
}

}  // namespace

int64_t ModelConfig::num_moe_layers() const {
  int64_t n = 0;
  for (int64_t i = 0; i < n_layer; ++i) n += is_moe_layer(i);
  return n;
}

double ModelConfig::inactive_parameters_per_token() const {
  if (!is_moe()) return 0;
  const double per_expert = (family == Family::GPT2 ? 2.0 : 3.0) * double(d_model) *
                            double(moe_ffn_hidden_size ? moe_ffn_hidden_size : d_ff);
  return double(num_moe_layers()) * double(num_moe_experts - moe_router_topk) * per_expert;
}

ModelConfig ModelConfig::resolved() const {
  ModelConfig c = *this;
  auto positive = [](int64_t v, const char* key) {
    FSDP_CHECK(v > 0, ConfigError, "model.", key, " must be positive, got ", v);
  };
  positive(c.n_layer, "n_layer");
  positive(c.d_model, "d_model");
  positive(c.n_head, "n_head");
  positive(c.vocab_size, "vocab_size");
  positive(c.seq_len, "seq_len");
  // Sizes no model is trained at: refused before anything is built (a module per layer) or
  // overflows (a padded vocabulary past int64).
  auto at_most = [](int64_t v, int64_t bound, const char* key) {
    FSDP_CHECK(v <= bound, ConfigError, "model.", key, " = ", v, " is larger than ", bound,
               ", the most this runtime builds");
  };
  at_most(c.n_layer, kMaxLayers, "n_layer");
  at_most(c.d_model, kMaxWidth, "d_model");
  at_most(c.n_head, c.d_model, "n_head");
  at_most(c.d_ff, kMaxWidth * 8, "d_ff");
  at_most(c.vocab_size, kMaxVocab, "vocab_size");
  at_most(c.padded_vocab_size, kMaxVocab + 127, "padded_vocab_size");
  at_most(c.seq_len, kMaxSeqLen, "seq_len");
  if (c.n_kv_head == 0) c.n_kv_head = c.n_head;
  if (c.d_ff == 0) {
    if (c.family == Family::GPT2) {
      c.d_ff = 4 * c.d_model;
    } else {
      const int64_t f = (8 * c.d_model + 2) / 3;
      c.d_ff = (f + 255) / 256 * 256;
    }
  }
  if (c.padded_vocab_size == 0) c.padded_vocab_size = (c.vocab_size + 127) / 128 * 128;
  FSDP_CHECK(c.d_model % c.n_head == 0, ConfigError, "model.d_model (", c.d_model,
             ") must be divisible by model.n_head (", c.n_head, ")");
  FSDP_CHECK(c.n_kv_head > 0 && c.n_head % c.n_kv_head == 0, ConfigError, "model.n_head (",
             c.n_head, ") must be a multiple of model.n_kv_head (", c.n_kv_head, ")");
  FSDP_CHECK(c.padded_vocab_size >= c.vocab_size, ConfigError, "model.padded_vocab_size (",
             c.padded_vocab_size, ") is smaller than model.vocab_size (", c.vocab_size, ")");
  FSDP_CHECK(c.norm_eps > 0, ConfigError, "model.norm_eps must be positive, got ", c.norm_eps);
  FSDP_CHECK(c.init_std > 0, ConfigError, "model.init_std must be positive, got ", c.init_std);
  FSDP_CHECK(c.classifier_chunk_rows >= 0, ConfigError,
             "model.classifier_chunk_rows must be >= 0 (0 = one chunk), got ",
             c.classifier_chunk_rows);
  check_moe(c);
  const double params = c.parameter_estimate();
  FSDP_CHECK(params <= kMaxParameters, ConfigError, "the model would have about ", params,
             " parameters (model.n_layer ", c.n_layer, ", model.d_model ", c.d_model,
             ", model.d_ff ", c.d_ff, ", model.padded_vocab_size ", c.padded_vocab_size,
             "), more than the ", kMaxParameters, " this runtime builds");
  if (c.family == Family::GPT2) {
    FSDP_CHECK(c.n_kv_head == c.n_head, ConfigError,
               "model.n_kv_head: GPT-2 has no grouped-query attention (n_kv_head must equal n_head)");
    FSDP_CHECK(c.tie_embeddings, ConfigError, "model.tie_embeddings: GPT-2's head is always tied");
  } else {
    FSDP_CHECK(c.head_dim() % 2 == 0, ConfigError, "model: rotary embeddings need an even head "
               "dimension, got ", c.head_dim());
    FSDP_CHECK(c.rope_theta > 0, ConfigError, "model.rope_theta must be positive, got ",
               c.rope_theta);
  }
  return c;
}

double ModelConfig::parameter_estimate() const {
  // In double: the point is to refuse sizes whose products overflow int64.
  const double C = double(d_model), F = double(d_ff), L = double(n_layer);
  const double H = double(n_head), Hkv = double(n_kv_head ? n_kv_head : n_head);
  const double D = C / H;
  const double attention = C * (H + 2 * Hkv) * D + H * D * C;
  const double mlp = family == Family::GPT2 ? 2 * C * F : 3 * C * F;
  const double per_layer = attention + mlp + 4 * C + (family == Family::GPT2 ? 2 * F + 4 * C : 0);
  const double vocab = double(padded_vocab_size ? padded_vocab_size : vocab_size);
  const double embeddings = vocab * C * (tie_embeddings ? 1 : 2) +
                            (family == Family::GPT2 ? double(seq_len) * C : 0);
  // An MoE layer replaces the dense MLP (and its biases) by a router, E experts without
  // biases and an optional shared expert.
  double moe = 0;
  if (num_moe_experts > 0 && moe_layer_freq >= 1) {
    const double per_mlp = family == Family::GPT2 ? 2 : 3;
    const double Fe = double(moe_ffn_hidden_size ? moe_ffn_hidden_size : d_ff);
    const double Fs = double(moe_shared_expert_intermediate_size);
    const double layer = C * double(num_moe_experts) +
                         double(num_moe_experts) * per_mlp * C * Fe + per_mlp * C * Fs;
    const double dense = mlp + (family == Family::GPT2 ? F + C : 0);
    int64_t n = 0;
    for (int64_t i = 0; i < n_layer && i < kMaxLayers; ++i)
      n += i >= moe_first_k_dense_replace && i % moe_layer_freq == 0;
    moe = double(n) * (layer - dense);
  }
  return L * per_layer + embeddings + 2 * C + moe;
}

std::string ModelConfig::str() const {
  return str_cat(family_name(family), " layers=", n_layer, " d_model=", d_model, " heads=", n_head,
                 " kv_heads=", n_kv_head, " d_ff=", d_ff, " vocab=", vocab_size, "/",
                 padded_vocab_size, " seq_len=", seq_len, " eps=", norm_eps,
                 family == Family::Llama ? str_cat(" rope_theta=", rope_theta) : std::string(),
                 " init_std=", init_std, " tied=", tie_embeddings ? "yes" : "no",
                 " fp32_residual=", fp32_residual_connection ? "yes" : "no",
                 " classifier_chunk_rows=", classifier_chunk_rows,
                 is_moe() ? str_cat(" experts=", num_moe_experts, " topk=", moe_router_topk,
                                    " moe_ffn=", moe_ffn_hidden_size, " shared=",
                                    moe_shared_expert_intermediate_size, " moe_layers=",
                                    num_moe_layers(), " router=", moe_router_score_function,
                                    moe_router_normalize ? "/normalized" : "",
                                    moe_router_enable_expert_bias ? "/bias" : "",
                                    " balancing=", moe_router_load_balancing_type)
                          : std::string());
}

ModelConfig gpt2_config(int depth) {
  ModelConfig c;
  c.family = Family::GPT2;
  c.n_layer = depth;
  switch (depth) {
    case 12: c.d_model = 768; c.n_head = 12; break;
    case 24: c.d_model = 1024; c.n_head = 16; break;
    case 36: c.d_model = 1280; c.n_head = 20; break;
    case 48: c.d_model = 1600; c.n_head = 25; break;
    default: FSDP_THROW(ConfigError, "GPT-2 depth ", depth, " is not one of 12, 24, 36, 48");
  }
  c.vocab_size = 50257;
  c.padded_vocab_size = 50304;
  c.seq_len = 1024;
  c.tie_embeddings = true;
  return c.resolved();
}

ModelConfig llama_small_config() {
  ModelConfig c;
  c.family = Family::Llama;
  c.n_layer = 4;
  c.d_model = 256;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.d_ff = 768;
  c.vocab_size = 50257;
  c.padded_vocab_size = 50304;
  c.seq_len = 256;
  c.rope_theta = 10000.0;
  c.tie_embeddings = false;
  return c.resolved();
}

ModelConfig model_config(const std::string& name) {
  if (name == "gpt2-d12") return gpt2_config(12);
  if (name == "gpt2-d24") return gpt2_config(24);
  if (name == "gpt2-d36") return gpt2_config(36);
  if (name == "gpt2-d48") return gpt2_config(48);
  if (name == "llama-small") return llama_small_config();
  FSDP_THROW(ConfigError, "unknown model preset '", name,
             "' (known: gpt2-d12, gpt2-d24, gpt2-d36, gpt2-d48, llama-small)");
}

std::map<std::string, std::string> config_metadata(const ModelConfig& c) {
  std::map<std::string, std::string> m = {{"family", family_name(c.family)},
          {"n_layer", std::to_string(c.n_layer)},
          {"d_model", std::to_string(c.d_model)},
          {"n_head", std::to_string(c.n_head)},
          {"n_kv_head", std::to_string(c.n_kv_head)},
          {"d_ff", std::to_string(c.d_ff)},
          {"vocab_size", std::to_string(c.vocab_size)},
          {"padded_vocab_size", std::to_string(c.padded_vocab_size)},
          {"seq_len", std::to_string(c.seq_len)},
          {"norm_eps", str_cat(c.norm_eps)},
          {"rope_theta", str_cat(c.rope_theta)},
          {"init_std", str_cat(c.init_std)},
          {"tie_embeddings", c.tie_embeddings ? "true" : "false"},
          {"fp32_residual_connection", c.fp32_residual_connection ? "true" : "false"}};
  if (!c.is_moe()) return m;  // dense models' metadata stays as it was
  m.insert({{"num_moe_experts", std::to_string(c.num_moe_experts)},
          {"moe_router_topk", std::to_string(c.moe_router_topk)},
          {"moe_ffn_hidden_size", std::to_string(c.moe_ffn_hidden_size)},
          {"moe_shared_expert_intermediate_size",
           std::to_string(c.moe_shared_expert_intermediate_size)},
          {"moe_layer_freq", std::to_string(c.moe_layer_freq)},
          {"moe_first_k_dense_replace", std::to_string(c.moe_first_k_dense_replace)},
          {"moe_router_score_function", c.moe_router_score_function},
          {"moe_router_normalize", c.moe_router_normalize ? "true" : "false"}});
  return m;
}

}  // namespace fsdp::models
