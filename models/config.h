// Model configurations: one struct for both families (a recipe's "model" section maps onto
// it key for key), presets, and validation.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fsdp::models {

enum class Family : uint8_t {
  GPT2,   // learned positions, LayerNorm, GELU MLP, biases, tied embeddings (llm.c's shapes)
  Llama,  // RoPE, RMSNorm, SwiGLU MLP, grouped-query attention, no biases, untied head
};
const char* family_name(Family f);       // "gpt2", "llama"
Family family_from_name(const std::string& name);  // throws ConfigError

// 8192 tokens: their bf16 logits take 824 MB at GPT-2's 50304 padded vocabulary (2.1 GB at
// Llama 3's 128256), while each chunk's matmuls (8192 x C x Vp) stay large enough to fill
// the GPU; the full logits (6.6 GB at 64 x 1024 tokens of GPT-2) are never held.
constexpr int64_t kDefaultClassifierChunkRows = 8192;

// The largest sizes resolved() accepts: far beyond any model trained today, small enough
// that building one cannot run away (a module per layer) or overflow.
constexpr int64_t kMaxLayers = 10000;
constexpr int64_t kMaxWidth = int64_t(1) << 20;      // d_model
constexpr int64_t kMaxVocab = int64_t(1) << 30;
constexpr int64_t kMaxSeqLen = int64_t(1) << 24;
constexpr double kMaxParameters = 1e13;

struct ModelConfig {
  Family family = Family::GPT2;
  int64_t n_layer = 0;
  int64_t d_model = 0;
  int64_t n_head = 0;
  int64_t n_kv_head = 0;          // 0: n_head (multi-head attention)
  int64_t d_ff = 0;               // 0: 4 d_model (GPT-2), 8/3 d_model rounded up to 256 (Llama)
  int64_t vocab_size = 0;         // real tokens
  int64_t padded_vocab_size = 0;  // 0: vocab_size rounded up to a multiple of 128
  int64_t seq_len = 0;            // GPT-2: number of learned positions
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;    // Llama only
  double init_std = 0.02;
  bool tie_embeddings = true;     // the head reuses the token embedding (GPT-2: always)
  // With bf16 compute, the residual stream (embedding output, every block's input and output,
  // and their gradients) is f32: the signal is summed without bf16 rounding (autocast's
  // numerics). false keeps it in the compute dtype (llm.c's and Megatron's default).
  bool fp32_residual_connection = false;
  // The loss path computes the head and its loss classifier_chunk_rows tokens at a time
  // (nn::classifier_loss): only one (chunk, Vp) logits buffer exists at once. 0 = all
  // tokens in one chunk.
  int64_t classifier_chunk_rows = kDefaultClassifierChunkRows;

  // ---- mixture of experts (Megatron-Bridge's key names; runtime/nn/moe.h)
  int64_t num_moe_experts = 0;        // E; 0 = a dense model
  int64_t moe_router_topk = 2;        // k experts per token
  int64_t moe_ffn_hidden_size = 0;    // each expert's hidden size; 0 = d_ff
  int64_t moe_shared_expert_intermediate_size = 0;  // a dense shared expert; 0 = none
  // Layer i is an MoE layer when i >= moe_first_k_dense_replace and i % moe_layer_freq == 0
  // (Megatron's integer moe_layer_freq; DeepSeek's first_k_dense_replace).
  int64_t moe_layer_freq = 1;
  int64_t moe_first_k_dense_replace = 0;
  std::string moe_router_score_function = "softmax";  // "softmax" | "sigmoid"
  // Divide the k chosen weights by their sum (Mixtral, Qwen3-MoE; Megatron's default
  // top-k-then-softmax); false keeps the scores as they are (OLMoE; Megatron's
  // moe_router_pre_softmax).
  bool moe_router_normalize = true;
  bool moe_router_enable_expert_bias = false;
  std::string moe_router_load_balancing_type = "aux_loss";  // | "seq_aux_loss" | "none"
  double moe_aux_loss_coeff = 0.0;
  double moe_z_loss_coeff = 0.0;
  bool is_moe() const { return num_moe_experts > 0; }
  bool is_moe_layer(int64_t layer) const {
    return is_moe() && layer >= moe_first_k_dense_replace && layer % moe_layer_freq == 0;
  }
  int64_t num_moe_layers() const;
  // Parameters a token does not use: the (E - k) experts it is not routed to, in every MoE
  // layer (for FLOPs per token: active = all - these).
  double inactive_parameters_per_token() const;

  // The same config with every 0 default filled in, checked: throws ConfigError naming the
  // offending field.
  ModelConfig resolved() const;
  // Parameters of the model this config describes, computed (not counted), in double so
  // that absurd sizes cannot overflow (resolved() refuses those above kMaxParameters).
  double parameter_estimate() const;
  int64_t head_dim() const { return d_model / n_head; }
  std::string str() const;  // one line, for logs
};

// The config as string key/values (family, n_layer, ..., fp32_residual_connection), the
// metadata that weight files written for other programs carry (tools/parity reads it).
std::map<std::string, std::string> config_metadata(const ModelConfig& c);

// llm.c's GPT-2 sizes by depth: d12 (124M), d24 (350M), d36 (774M), d48 (1558M); vocabulary
// 50257 padded to 50304, 1024 positions.
ModelConfig gpt2_config(int depth);
// A small Llama-style config for tests and parity runs (GQA: 4 query heads share 2 kv heads).
ModelConfig llama_small_config();
// Presets by name: "gpt2-d12", "gpt2-d24", "gpt2-d36", "gpt2-d48", "llama-small". Throws
// ConfigError listing the names otherwise.
ModelConfig model_config(const std::string& name);

}  // namespace fsdp::models
