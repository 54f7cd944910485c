#include "models/language_model.h"

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

}  // namespace fsdp::models
