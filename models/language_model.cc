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
