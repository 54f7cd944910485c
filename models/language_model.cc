#include "models/language_model.h"

#include "kernels/ops.h"
#include "runtime/nn/functional.h"

namespace fsdp::models {

DType LanguageModel::residual_dtype(DType compute) const {
  return config_.fp32_residual_connection && compute == DType::bf16 ? DType::f32 : compute;
}

Tensor LanguageModel::forward(Graph& g, const Tensor& idx, const Tensor& targets, int64_t n_valid,
                              Tensor* logits) {
  FSDP_CHECK(targets.shape() == idx.shape(), ShapeError, "forward: targets ", targets.str(),
             " do not match idx ", idx.str());
  return run_forward(g, [&] {
    if (!logits) {
      const Tensor x = compute_hidden(g, idx);  // (B, T, C)
      return nn::classifier_loss(g, x, head_weight(), targets, config_.vocab_size, n_valid,
                                 config_.classifier_chunk_rows);
    }
    const Tensor lg = compute_logits(g, idx);  // (B, T, Vp)
    *logits = lg.view(lg.shape());  // a view: no autograd record
    return nn::cross_entropy(g, lg, targets, config_.vocab_size, n_valid);
  });
}

std::vector<nn::MoELayer*> LanguageModel::moe_layers() {
  std::vector<nn::MoELayer*> out;
  for (nn::Module* m : modules())
    if (auto* moe = dynamic_cast<nn::MoELayer*>(m)) out.push_back(moe);
  return out;
}

nn::MoeOptions moe_options(const ModelConfig& c) {
  nn::MoeOptions o;
  o.experts = c.num_moe_experts;
  o.top_k = c.moe_router_topk;
  o.hidden = c.moe_ffn_hidden_size;
  o.score = c.moe_router_score_function == "sigmoid" ? ops::RouterScore::Sigmoid
                                                     : ops::RouterScore::Softmax;
  o.normalize = c.moe_router_normalize;
  o.balancing = nn::moe_balancing_from_name(c.moe_router_load_balancing_type);
  o.aux_loss_coeff = o.balancing == nn::MoeBalancing::None ? 0.0 : c.moe_aux_loss_coeff;
  o.z_loss_coeff = c.moe_z_loss_coeff;
  o.expert_bias = c.moe_router_enable_expert_bias;
  return o;
}

std::unique_ptr<nn::MLP> build_mlp(const ModelConfig& c, int64_t layer, nn::MlpActivation act,
                                   bool bias, nn::InitRule init, nn::InitRule proj_init) {
  if (c.is_moe_layer(layer))
    return std::make_unique<nn::MoELayer>(c.d_model, moe_options(c),
                                          c.moe_shared_expert_intermediate_size, act, init,
                                          proj_init);
  if (act == nn::MlpActivation::Gelu)
    return std::make_unique<nn::GeluMLP>(c.d_model, c.d_ff, bias, init, proj_init);
  return std::make_unique<nn::SwiGLUMLP>(c.d_model, c.d_ff, bias, init, proj_init);
}

void add_mlp_rows(std::vector<nn::LayerRow>& rows, const std::string& mlp, nn::MlpActivation act) {
  using S = nn::LayerStyle;
  const bool gelu = act == nn::MlpActivation::Gelu;
  const std::string fc = gelu ? ".fc" : ".gate_up";  // gate_up: [gate | up], split each
  const int parts = gelu ? 1 : 2;
  for (const std::string& dense : {mlp, mlp + ".shared_expert"}) {
    rows.push_back({dense + fc, S::column, "", parts, {}});
    rows.push_back({dense + ".proj", S::row, "", 1, {}});
  }
  rows.push_back({mlp, S::experts, "moe", 1, {}});
}

nn::AttentionHeads attention_heads(const ModelConfig& c) {
  return {c.n_head, c.n_kv_head, c.head_dim()};
}

Tensor LanguageModel::compute_logits(Graph& g, const Tensor& idx) {
  return nn::linear(g, compute_hidden(g, idx), head_weight());  // (B, T, Vp)
}

Tensor LanguageModel::logits(Graph& g, const Tensor& idx) {
  return run_forward(g, [&] { return compute_logits(g, idx); });
}

Tensor LanguageModel::decode(Graph& g, const Tensor& idx, KVCache& cache) {
  FSDP_CHECK(!g.grad_enabled(), ValueError,
             "decode is for generation: run it under autograd::NoGradGuard");
  FSDP_CHECK(idx.dim() == 2 && idx.size(1) > 0, ShapeError, "decode: idx ", idx.str(),
             " must be (B, Tn) with Tn > 0");
  FSDP_CHECK(cache.layers.size() == blocks().size(), ValueError, "decode: a cache of ",
             cache.layers.size(), " layers for a model of ", blocks().size());
  const int64_t position = cache.length, t = idx.size(1);
  FSDP_CHECK(position + t <= cache.capacity, IndexError, "decode: ", position + t,
             " positions do not fit a cache of ", cache.capacity);
  const Tensor out = run_forward(g, [&] {
    const Tensor hidden = decode_hidden(g, idx, cache, position);  // (B, Tn, C)
    const Tensor last = hidden.select(1, t - 1);                   // (B, C)
    return nn::linear(g, ops::contiguous(g.ctx(), last), head_weight());  // (B, Vp)
  });
  cache.length = position + t;
  return out;
}

}  // namespace fsdp::models
