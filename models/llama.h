// A Llama-style decoder: RMSNorm, rotary embeddings ("rotate half", as Hugging Face), fused
// qkv with grouped-query attention, SwiGLU MLP with a fused gate|up projection, no biases,
// untied head (unless config.tie_embeddings).
//
// Parameter names: embed.weight (Vp, C), layers.<i>.attn_norm.weight,
// layers.<i>.attn.qkv.weight ((H + 2 Hkv) D, C), layers.<i>.attn.proj.weight (C, H D),
// layers.<i>.mlp_norm.weight, layers.<i>.mlp.gate_up.weight (2F, C) = [gate; up],
// layers.<i>.mlp.proj.weight (C, F), norm.weight, lm_head.weight (Vp, C).
// MoE layers (config.is_moe_layer) have layers.<i>.mlp.router.weight (E, C),
// layers.<i>.mlp.experts.gate_up (E, 2F, C), layers.<i>.mlp.experts.proj (E, C, F) and
// optionally layers.<i>.mlp.shared_expert.{gate_up,proj}.weight (runtime/nn/moe.h).
// Init: every weight N(0, init_std) (Hugging Face's rule), norm weights 1.
#pragma once

#include <memory>

#include "models/language_model.h"
#include "runtime/nn/layers.h"

namespace fsdp::models {

class LlamaBlock : public nn::UnaryModule {
 public:
  // `layer`: the block's index (config.is_moe_layer says whether its MLP is an MoE layer).
  explicit LlamaBlock(const ModelConfig& c, int64_t layer = 0);
  std::string kind() const override { return "block"; }
  nn::RMSNorm attn_norm;
  nn::CausalSelfAttention attn;
  nn::RMSNorm mlp_norm;
  std::unique_ptr<nn::MLP> mlp;  // nn::SwiGLUMLP, or nn::MoELayer with SwiGLU experts

  // compute() for tokens after those in `cache` (LanguageModel::decode).
  Tensor decode(Graph& g, const Tensor& x, nn::AttentionCache& cache, int64_t position);

 protected:
  Tensor compute(Graph& g, const Tensor& x) override;  // (B, T, C) -> (B, T, C)
};

class Llama : public LanguageModel {
 public:
  explicit Llama(const ModelConfig& config);
  std::string kind() const override { return "llama"; }
  nn::Embedding embed;  // (Vp, C)
  nn::ModuleList layers;
  nn::RMSNorm norm;
  std::unique_ptr<nn::Linear> lm_head;  // (Vp, C); null when tied to embed
  nn::VocabularyTables vocabulary_tables() override {
    return {&embed.weight(), &head_weight(), nullptr};
  }
  nn::LayerTable layer_table() const override;

 protected:
  Tensor compute_hidden(Graph& g, const Tensor& idx) override;
  Tensor decode_hidden(Graph& g, const Tensor& idx, KVCache& cache, int64_t position) override;
  nn::Parameter& head_weight() override { return lm_head ? lm_head->weight() : embed.weight(); }
};

}  // namespace fsdp::models
