// LanguageModel: what the trainer, FSDP and the tools see of a model.
//
// A model is built as specs (no memory); nn::materialize() or FSDP then gives its
// parameters data. Its units are found by kind: blocks() are the modules of kind "block",
// in forward order; everything else (embeddings, final norm, head) belongs to the root.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "models/config.h"
#include "models/kv_cache.h"
#include "runtime/nn/layer_table.h"
#include "runtime/nn/layers.h"
#include "runtime/nn/module.h"
#include "runtime/nn/moe.h"
#include "runtime/nn/tensor_parallel.h"

namespace fsdp::models {

using autograd::Graph;

class LanguageModel : public nn::Module {
 public:
  const ModelConfig& config() const { return config_; }

  // Mean cross-entropy over the targets that are not -1: idx and targets (B, T) i32 on the
  // graph's device, T <= seq_len for GPT-2. Returns a one-element f32 tensor (f64 for f64
  // parameters). `n_valid` is the number of targets != -1 when the caller knows it (the
  // trainer does: it avoids reading targets back from the device); -1 counts them.
  // Without `logits`, the head and the loss run as one chunked op (nn::classifier_loss,
  // config.classifier_chunk_rows tokens at a time): the (B, T, Vp) logits never exist.
  // If `logits` is given it receives the (B, T, Vp) logits, computed whole by the unchunked
  // path (linear, then cross_entropy); NOTE that backward then overwrites that buffer with
  // the logits' gradient (the fused loss works in place), so copy it first if it is needed
  // after backward.
  Tensor forward(Graph& g, const Tensor& idx, const Tensor& targets, int64_t n_valid = -1,
                 Tensor* logits = nullptr);
  // Logits only: (B, T, Vp), for generation and parity checks.
  Tensor logits(Graph& g, const Tensor& idx);

  // Incremental decoding, for generation with the graph's gradients off: idx (B, Tn) holds
  // the tokens at positions [cache.length, cache.length + Tn) (the prompt at once, then one
  // token at a time); their keys and values join `cache` and cache.length grows by Tn.
  // Returns the logits (B, Vp) of the last of them: what logits() gives at that position
  // for the whole sequence, up to rounding. IndexError when the cache (or, for GPT-2, the
  // learned positions) would overflow.
  Tensor decode(Graph& g, const Tensor& idx, KVCache& cache);

  // The transformer blocks, in forward order (FSDP's default units).
  std::vector<nn::Module*> blocks() { return modules_of_kind("block"); }
  // The mixture-of-experts layers, in forward order (empty for a dense model).
  std::vector<nn::MoELayer*> moe_layers();

  // The token embedding, the head and the learned positions (what a tensor-parallel plan
  // splits along the vocabulary).
  virtual nn::VocabularyTables vocabulary_tables() = 0;
  // Which layer plays which part for the plans applied from outside (tensor, context and
  // expert parallelism, FP8), by name: the model's own table (runtime/nn/layer_table.h).
  virtual nn::LayerTable layer_table() const = 0;

 protected:
  explicit LanguageModel(const ModelConfig& config) : config_(config.resolved()) {}
  // idx (B, T) -> the final norm's output (B, T, C), the head's input, without the root's
  // hooks (forward/logits add them).
  virtual Tensor compute_hidden(Graph& g, const Tensor& idx) = 0;
  // idx (B, Tn) at positions [position, position + Tn) -> the final norm's output (B, Tn, C),
  // through every block's decode with its layer of the cache.
  virtual Tensor decode_hidden(Graph& g, const Tensor& idx, KVCache& cache, int64_t position) = 0;
  // The head's weight (Vp, C): its own, or the token embedding's when tied.
  virtual nn::Parameter& head_weight() = 0;
  // idx (B, T) -> logits (B, T, Vp) = hidden @ head_weight^T, without the root's hooks.
  Tensor compute_logits(Graph& g, const Tensor& idx);
  // The residual stream's dtype for parameters of dtype `compute`: f32 beside bf16 when
  // config.fp32_residual_connection, `compute` otherwise.
  DType residual_dtype(DType compute) const;

  ModelConfig config_;
};

// The MoE options a config gives its MoE layers.
nn::MoeOptions moe_options(const ModelConfig& c);
// Layer `layer`'s MLP: the dense MLP (hidden d_ff, with biases when `bias`), or, where
// config.is_moe_layer(layer), an MoE layer of the same activation (no biases).
std::unique_ptr<nn::MLP> build_mlp(const ModelConfig& c, int64_t layer, nn::MlpActivation act,
                                   bool bias, nn::InitRule init, nn::InitRule proj_init);
// The layer-table rows of what build_mlp builds at `mlp` ("h.*.mlp"): a dense MLP's fc (or
// gate_up) column-parallel and proj row-parallel; an MoE layer's experts, and its shared
// expert's rows as a dense MLP's.
void add_mlp_rows(std::vector<nn::LayerRow>& rows, const std::string& mlp, nn::MlpActivation act);
// The heads of c's attention, for a column_heads row.
nn::AttentionHeads attention_heads(const ModelConfig& c);

}  // namespace fsdp::models
