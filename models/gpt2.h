// GPT-2 in llm.c's shapes: learned positions, pre-LN blocks, fused qkv, GELU MLP, biases,
// final LayerNorm, head tied to the token embedding.
//
// Parameter names: wte.weight (Vp, C), wpe.weight (seq_len, C), h.<i>.ln_1.{weight,bias},
// h.<i>.attn.qkv.{weight,bias}, h.<i>.attn.proj.{weight,bias}, h.<i>.ln_2.{weight,bias},
// h.<i>.mlp.fc.{weight,bias}, h.<i>.mlp.proj.{weight,bias}, ln_f.{weight,bias}.
// Init: weights N(0, init_std), attn.proj and mlp.proj weights N(0, init_std / sqrt(2 L)),
// biases 0, LayerNorm weights 1. MoE layers (config.is_moe_layer) have h.<i>.mlp.router.weight
// (E, C), h.<i>.mlp.experts.fc (E, F, C), h.<i>.mlp.experts.proj (E, C, F) (no biases) and
// optionally h.<i>.mlp.shared_expert.{fc,proj}.weight (runtime/nn/moe.h).
#pragma once

#include "models/language_model.h"
#include "runtime/nn/layers.h"

namespace fsdp::models {

class GPT2Block : public nn::UnaryModule {
 public:
  // `layer`: the block's index (config.is_moe_layer says whether its MLP is an MoE layer).
  explicit GPT2Block(const ModelConfig& c, int64_t layer = 0);
  std::string kind() const override { return "block"; }
  nn::LayerNorm ln_1;
  nn::CausalSelfAttention attn;
  nn::LayerNorm ln_2;
  std::unique_ptr<nn::MLP> mlp;  // nn::GeluMLP, or nn::MoELayer with GELU experts

  // compute() for tokens after those in `cache` (LanguageModel::decode).
  Tensor decode(Graph& g, const Tensor& x, nn::AttentionCache& cache, int64_t position);

 protected:
  Tensor compute(Graph& g, const Tensor& x) override;  // (B, T, C) -> (B, T, C)
};

class GPT2 : public LanguageModel {
 public:
  explicit GPT2(const ModelConfig& config);
  std::string kind() const override { return "gpt2"; }
  nn::Embedding wte;  // (Vp, C), also the head
  nn::Embedding wpe;  // (seq_len, C)
  nn::ModuleList h;
  nn::LayerNorm ln_f;
  nn::VocabularyTables vocabulary_tables() override {
    return {&wte.weight(), &wte.weight(), &wpe.weight()};
  }
  nn::LayerTable layer_table() const override;

 protected:
  Tensor compute_hidden(Graph& g, const Tensor& idx) override;
  Tensor decode_hidden(Graph& g, const Tensor& idx, KVCache& cache, int64_t position) override;
  nn::Parameter& head_weight() override { return wte.weight(); }  // tied
};

}  // namespace fsdp::models
