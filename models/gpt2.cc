#include "models/gpt2.h"

#include <cmath>

#include "kernels/ops.h"
#include "runtime/nn/functional.h"

namespace fsdp::models {
namespace {

nn::AttentionConfig attention_config(const ModelConfig& c) {
  nn::AttentionConfig a;
  a.dim = c.d_model;
  a.n_head = c.n_head;
  a.n_kv_head = c.n_head;
  a.bias = true;
  return a;
}

nn::InitRule weight_init(const ModelConfig& c) { return nn::InitRule::normal(0.0, c.init_std); }

// The residual projections are scaled by 1/sqrt(2 L): each block adds two of them to the stream.
nn::InitRule residual_init(const ModelConfig& c) {
  return nn::InitRule::normal(0.0, c.init_std / std::sqrt(2.0 * double(c.n_layer)));
}

}  // namespace

GPT2Block::GPT2Block(const ModelConfig& c, int64_t layer)
    : ln_1(c.d_model, c.norm_eps),
      attn(attention_config(c), weight_init(c), residual_init(c)),
      ln_2(c.d_model, c.norm_eps),
      mlp(build_mlp(c, layer, nn::MlpActivation::Gelu, true, weight_init(c), residual_init(c))) {
  add_module("ln_1", ln_1);
  add_module("attn", attn);
  add_module("ln_2", ln_2);
  add_module("mlp", *mlp);
}

Tensor GPT2Block::compute(Graph& g, const Tensor& x) {
  // The mid-block add and ln_2 run as one kernel; the block's last add stays separate, since
  // the norm after it belongs to the next block (another FSDP unit).
  const nn::AddNorm h = ln_2.add_and_norm(g, x, attn(g, ln_1(g, x)));  // (B, T, C) twice
  return nn::add(g, h.sum, (*mlp)(g, h.out));                             // (B, T, C)
}

Tensor GPT2Block::decode(Graph& g, const Tensor& x, nn::AttentionCache& cache, int64_t position) {
  return run_forward(g, [&] {
    const nn::AddNorm h = ln_2.add_and_norm(g, x, attn.decode(g, ln_1(g, x), cache, position));
    return nn::add(g, h.sum, (*mlp)(g, h.out));
  });
}

GPT2::GPT2(const ModelConfig& config)
    : LanguageModel(config),
      wte(config_.padded_vocab_size, config_.d_model, weight_init(config_)),
      wpe(config_.seq_len, config_.d_model, weight_init(config_)),
      ln_f(config_.d_model, config_.norm_eps) {
  FSDP_CHECK(config_.family == Family::GPT2, ConfigError, "GPT2 built from a ",
             family_name(config_.family), " config");
  add_module("wte", wte);
  add_module("wpe", wpe);
  add_module("h", h);
  for (int64_t i = 0; i < config_.n_layer; ++i) h.append(std::make_unique<GPT2Block>(config_, i));
  add_module("ln_f", ln_f);
}

nn::LayerTable GPT2::layer_table() const {
  using S = nn::LayerStyle;
  std::vector<nn::LayerRow> rows = {
      {"h.*", S::block, "", 1, {}},
      {"h.*.ln_1", S::norm, "", 1, {}},
      {"h.*.attn", S::attention, "", 1, {}},
      {"h.*.attn.qkv", S::column_heads, "", 1, attention_heads(config_)},
      {"h.*.attn.proj", S::row, "", 1, {}},
      {"h.*.ln_2", S::norm, "", 1, {}},
      {"ln_f", S::final_norm, "", 1, {}},
  };
  add_mlp_rows(rows, "h.*.mlp", nn::MlpActivation::Gelu);
  return nn::LayerTable(std::move(rows));
}

Tensor GPT2::compute_hidden(Graph& g, const Tensor& idx) {
  FSDP_CHECK(idx.dim() == 2 && idx.size(1) <= config_.seq_len, ShapeError, "GPT-2: idx ",
             idx.str(), " must be (B, T) with T <= ", config_.seq_len);
  // Token and position embeddings in one kernel (wte and wpe belong to the root unit).
  const DType stream = residual_dtype(wte.weight().checked_data().dtype());
  Tensor x = nn::embedding(g, idx, wte.weight(), &wpe.weight(), stream);  // (B, T, C)
  for (size_t i = 0; i < h.size(); ++i) x = static_cast<GPT2Block&>(h[i])(g, x);
  x = ln_f(g, x);
  return x;  // (B, T, C); the head is wte (head_weight)
}

Tensor GPT2::decode_hidden(Graph& g, const Tensor& idx, KVCache& cache, int64_t position) {
  const int64_t t = idx.size(1);
  FSDP_CHECK(position + t <= config_.seq_len, IndexError, "GPT-2: positions up to ",
             position + t, " exceed the ", config_.seq_len, " learned positions");
  // The token embedding plus the learned positions [position, position + Tn): the same
  // kernel as in training, given the rows of wpe these tokens sit at.
  Context& ctx = g.ctx();
  const Tensor& table = wte.weight().checked_data();
  Tensor x = ctx.empty(Shape{idx.size(0), t, config_.d_model}, residual_dtype(table.dtype()));
  ops::embedding_forward(ctx, x, idx, table, wpe.weight().checked_data().narrow(0, position, t));
  for (size_t i = 0; i < h.size(); ++i)
    x = static_cast<GPT2Block&>(h[i]).decode(g, x, cache.layers[i], position);
  return ln_f(g, x);
}

}  // namespace fsdp::models
