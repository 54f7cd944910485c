// The layers models are built from. Each is a spec until materialized (see init.h): its
// constructor registers parameter shapes and init rules and allocates nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "runtime/nn/context_parallel.h"
#include "runtime/nn/functional.h"
#include "runtime/nn/module.h"
#include "runtime/nn/tensor_parallel.h"

namespace fsdp::nn {

// An ordered list of child modules named "0", "1", ... (a model's "h" or "layers"), owning
// them. It has no forward of its own: the parent iterates it.
class ModuleList : public Module {
 public:
  std::string kind() const override { return "list"; }
  template <typename M>
  M& append(std::unique_ptr<M> module) {
    M& ref = *module;
    add_module(std::to_string(owned_.size()), ref);
    owned_.push_back(std::move(module));
    return ref;
  }
  size_t size() const { return owned_.size(); }
  Module& operator[](size_t i) const { return *owned_.at(i); }

 private:
  std::vector<std::unique_ptr<Module>> owned_;
};

// y (..., out) = x (..., in) @ weight^T (+ bias), with an optional fused GELU.
// weight (out, in) is decayed; bias (out) starts at zero and is not decayed.
//
// Tensor parallelism (set_parallel_style, by a plan; the slicing of the parameters is the
// plan's too): a column-parallel layer takes the whole input and gives its slice of the
// output features; a row-parallel one takes its slice of the input features and gives the
// whole output, summed over the group, with the (whole) bias added after the sum. Layers
// that fuse a Linear into a larger op (the MLP) pass its parallel_input and fused_bias to
// that op and use parallel_output after it.
class Linear : public UnaryModule {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias, InitRule weight_init,
         ops::Epilogue epilogue = ops::Epilogue::None);
  std::string kind() const override { return "linear"; }
  Parameter& weight() { return *weight_; }
  Parameter* bias() { return bias_; }

  // `sequence`: sequence parallelism around the layer (the input of a column-parallel layer
  // and the output of a row-parallel one are this rank's part of the sequence).
  void set_parallel_style(ParallelStyle style, ParallelGroup* group, bool sequence = false);
  ParallelStyle parallel_style() const { return style_; }
  ParallelGroup* parallel_group() const { return group_; }  // null when replicated
  // How the matmul takes its input (column-parallel: its exchange over the group).
  ColumnParallelInput parallel_input() const {
    return {style_ == ParallelStyle::column ? group_ : nullptr, sequence_};
  }
  // The bias to fuse into the matmul: none for a row-parallel layer (added after the sum).
  Parameter* fused_bias() { return style_ == ParallelStyle::row ? nullptr : bias_; }
  // The matmul's output as the layer gives it (row: summed over the group, plus the bias).
  Tensor parallel_output(Graph& g, const Tensor& y);

 protected:
  Tensor compute(Graph& g, const Tensor& x) override;

 private:
  Parameter* weight_;
  Parameter* bias_ = nullptr;
  ops::Epilogue epilogue_;
  ParallelStyle style_ = ParallelStyle::replicated;
  ParallelGroup* group_ = nullptr;
  bool sequence_ = false;
};

// An embedding table weight (rows, C), decayed (as in llm.c's GPT-2 recipe). forward()
// looks up token ids: idx (B, T) i32 -> (B, T, C). GPT-2 keeps its learned positions in a
// second table and calls nn::embedding(g, idx, wte.weight(), &wpe.weight()), which adds
// both in one kernel.
class Embedding : public UnaryModule {
 public:
  Embedding(int64_t rows, int64_t dim, InitRule init);
  std::string kind() const override { return "embedding"; }
  Parameter& weight() { return *weight_; }

 protected:
  Tensor compute(Graph& g, const Tensor& idx) override;

 private:
  Parameter* weight_;
};

// LayerNorm over the last dimension: weight (C) ones, bias (C) zeros, neither decayed.
class LayerNorm : public UnaryModule {
 public:
  LayerNorm(int64_t dim, double eps);
  std::string kind() const override { return "layernorm"; }
  Parameter& weight() { return *weight_; }
  Parameter& bias() { return *bias_; }
  // x + residual and its norm, in one forward kernel (nn::add_layer_norm).
  AddNorm add_and_norm(Graph& g, const Tensor& x, const Tensor& residual);

 protected:
  Tensor compute(Graph& g, const Tensor& x) override;

 private:
  Parameter* weight_;
  Parameter* bias_;
  double eps_;
};

// RMSNorm over the last dimension: weight (C) ones, not decayed.
class RMSNorm : public UnaryModule {
 public:
  RMSNorm(int64_t dim, double eps);
  std::string kind() const override { return "rmsnorm"; }
  Parameter& weight() { return *weight_; }
  // x + residual and its norm, in one forward kernel (nn::add_rms_norm).
  AddNorm add_and_norm(Graph& g, const Tensor& x, const Tensor& residual);

 protected:
  Tensor compute(Graph& g, const Tensor& x) override;

 private:
  Parameter* weight_;
  double eps_;
};

// What the MLPs share: they run as one op (nn::mlp), which can recompute the activation in
// backward instead of saving it ("selective" activation recompute).
class MLP : public UnaryModule {
 public:
  std::string kind() const override { return "mlp"; }
  bool recompute_activation = false;
};

// GPT-2's MLP: fc (C -> F), GELU, then proj (F -> C).
class GeluMLP : public MLP {
 public:
  GeluMLP(int64_t dim, int64_t hidden, bool bias, InitRule init, InitRule proj_init);
  Linear fc;
  Linear proj;

 protected:
  Tensor compute(Graph& g, const Tensor& x) override;
};

// Llama's MLP: one fused projection gate_up (C -> 2F) = [gate | up], silu(gate) * up,
// then proj (F -> C).
class SwiGLUMLP : public MLP {
 public:
  SwiGLUMLP(int64_t dim, int64_t hidden, bool bias, InitRule init, InitRule proj_init);
  Linear gate_up;
  Linear proj;

 protected:
  Tensor compute(Graph& g, const Tensor& x) override;
};

// Causal self-attention with a fused qkv projection (C -> (H + 2 Hkv) D, rows ordered
// [q heads | k heads | v heads]), multi-head (Hkv == H) or grouped-query (H % Hkv == 0),
// optional rotary embeddings (rope_theta > 0), and an output projection proj (H D -> C).
struct AttentionConfig {
  int64_t dim = 0;         // C
  int64_t n_head = 0;      // H
  int64_t n_kv_head = 0;   // Hkv
  int64_t head_dim = 0;    // D (C / H when 0)
  bool bias = false;
  double rope_theta = 0;   // 0: no rotary embeddings
};

// The keys and values one attention layer has seen, for generation one token at a time:
// (B, capacity, Hkv, D) each; rows [0, the model's KVCache::length) are filled.
struct AttentionCache {
  Tensor keys, values;
};

class CausalSelfAttention : public UnaryModule {
 public:
  CausalSelfAttention(const AttentionConfig& config, InitRule init, InitRule proj_init);
  std::string kind() const override { return "attention"; }
  const AttentionConfig& config() const { return config_; }
  // The query heads and the key/value heads this rank computes: the ones its slice of qkv
  // holds under tensor parallelism (ranges [q | k | v] of whole heads), all of them
  // otherwise.
  int64_t local_heads();
  int64_t local_kv_heads();
  // Context parallelism: this rank holds the tokens `layout` says of each sequence, and the
  // attention runs over the whole sequence through `group` (context_parallel_attention).
  void set_context_parallel(const ContextParallelLayout& layout, ParallelGroup* group,
                            ContextParallelComm comm);
  // Generation, with the graph's gradients off: x (B, Tn, C) holds the tokens at positions
  // [position, position + Tn); their keys and values join `cache` (nn::cached_attention).
  // Returns (B, Tn, C), what forward() gives those tokens after the cached ones.
  Tensor decode(Graph& g, const Tensor& x, AttentionCache& cache, int64_t position);
  Linear qkv;
  Linear proj;

 protected:
  Tensor compute(Graph& g, const Tensor& x) override;

 private:
  // Heads in rows [begin, end) of qkv's range `i` of this rank's slice.
  int64_t heads_in_range(size_t i, int64_t whole);

  AttentionConfig config_;
  ContextParallelLayout cp_layout_;
  ParallelGroup* cp_group_ = nullptr;
  ContextParallelComm cp_comm_ = ContextParallelComm::all_gather;
};

}  // namespace fsdp::nn
