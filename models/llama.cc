#include "models/llama.h"

#include "runtime/nn/functional.h"

namespace fsdp::models {
namespace {

nn::AttentionConfig attention_config(const ModelConfig& c) {
  nn::AttentionConfig a;
  a.dim = c.d_model;
  a.n_head = c.n_head;
  a.n_kv_head = c.n_kv_head;
  a.bias = false;
  a.rope_theta = c.rope_theta;
  return a;
}

nn::InitRule weight_init(const ModelConfig& c) { return nn::InitRule::normal(0.0, c.init_std); }

}  // namespace

LlamaBlock::LlamaBlock(const ModelConfig& c, int64_t layer)
    : attn_norm(c.d_model, c.norm_eps),
      attn(attention_config(c), weight_init(c), weight_init(c)),
      mlp_norm(c.d_model, c.norm_eps),
      mlp(build_mlp(c, layer, nn::MlpActivation::SwiGLU, false, weight_init(c), weight_init(c))) {
  add_module("attn_norm", attn_norm);
  add_module("attn", attn);
  add_module("mlp_norm", mlp_norm);
  add_module("mlp", *mlp);
}

Tensor LlamaBlock::compute(Graph& g, const Tensor& x) {
  // The mid-block add and mlp_norm run as one kernel (see GPT2Block::compute).
  const nn::AddNorm h = mlp_norm.add_and_norm(g, x, attn(g, attn_norm(g, x)));  // (B, T, C)
  return nn::add(g, h.sum, (*mlp)(g, h.out));                                      // (B, T, C)
}

nn::LayerTable Llama::layer_table() const {
  using S = nn::LayerStyle;
  std::vector<nn::LayerRow> rows = {
      {"layers.*", S::block, "", 1, {}},
      {"layers.*.attn_norm", S::norm, "", 1, {}},
      {"layers.*.attn", S::attention, "", 1, {}},
      {"layers.*.attn.qkv", S::column_heads, "", 1, attention_heads(config_)},
      {"layers.*.attn.proj", S::row, "", 1, {}},
      {"layers.*.mlp_norm", S::norm, "", 1, {}},
      {"norm", S::final_norm, "", 1, {}},
  };
  add_mlp_rows(rows, "layers.*.mlp", nn::MlpActivation::SwiGLU);
  return nn::LayerTable(std::move(rows));
}

Tensor LlamaBlock::decode(Graph& g, const Tensor& x, nn::AttentionCache& cache,
                          int64_t position) {
  return run_forward(g, [&] {
    const nn::AddNorm h =
        mlp_norm.add_and_norm(g, x, attn.decode(g, attn_norm(g, x), cache, position));
    return nn::add(g, h.sum, (*mlp)(g, h.out));
  });
}

Llama::Llama(const ModelConfig& config)
    : LanguageModel(config),
      embed(config_.padded_vocab_size, config_.d_model, weight_init(config_)),
      norm(config_.d_model, config_.norm_eps) {
  FSDP_CHECK(config_.family == Family::Llama, ConfigError, "Llama built from a ",
             family_name(config_.family), " config");
  add_module("embed", embed);
  add_module("layers", layers);
  for (int64_t i = 0; i < config_.n_layer; ++i)
    layers.append(std::make_unique<LlamaBlock>(config_, i));
  add_module("norm", norm);
  if (!config_.tie_embeddings) {
    lm_head = std::make_unique<nn::Linear>(config_.d_model, config_.padded_vocab_size, false,
                                           weight_init(config_));
    add_module("lm_head", *lm_head);
  }
}

Tensor Llama::compute_hidden(Graph& g, const Tensor& idx) {
  FSDP_CHECK(idx.dim() == 2, ShapeError, "Llama: idx ", idx.str(), " must be (B, T)");
  const DType stream = residual_dtype(embed.weight().checked_data().dtype());
  Tensor x = nn::embedding(g, idx, embed.weight(), nullptr, stream);  // (B, T, C)
  for (size_t i = 0; i < layers.size(); ++i) x = static_cast<LlamaBlock&>(layers[i])(g, x);
  x = norm(g, x);
  return x;  // (B, T, C); the head is lm_head or embed (head_weight)
}

Tensor Llama::decode_hidden(Graph& g, const Tensor& idx, KVCache& cache, int64_t position) {
  // Rotary embeddings place the tokens: the attention rotates them at their positions.
  const DType stream = residual_dtype(embed.weight().checked_data().dtype());
  Tensor x = nn::embedding(g, idx, embed.weight(), nullptr, stream);  // (B, Tn, C)
  for (size_t i = 0; i < layers.size(); ++i)
    x = static_cast<LlamaBlock&>(layers[i]).decode(g, x, cache.layers[i], position);
  return norm(g, x);
}

}  // namespace fsdp::models
