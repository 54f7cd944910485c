// The Hugging Face layout of our models: config.json and tensor names, and how each Hugging
// Face tensor is cut from one of our parameters.
//
// GPT-2 (GPT2LMHeadModel): transformer.wte / wpe / h.<i>.{ln_1, attn.c_attn, attn.c_proj,
// ln_2, mlp.c_fc, mlp.c_proj} / ln_f, where c_attn, c_proj and c_fc are Conv1D layers whose
// weights are stored (in, out): the transpose of our Linear weights (out, in). c_attn stays
// fused (q | k | v), as Hugging Face keeps it. The head is tied to wte and not stored.
//
// Llama (LlamaForCausalLM): model.embed_tokens, model.layers.<i>.{input_layernorm,
// self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm,
// lm_head (absent when tied). Our fused qkv weight's rows split into q_proj, k_proj, v_proj,
// our fused gate_up's rows into gate_proj and up_proj. Our rotary embedding is Hugging
// Face's "rotate half" form, so q and k need no permutation.
//
// Mixtral (MixtralForCausalLM) is the Llama layout with each MLP replaced by
// model.layers.<i>.block_sparse_moe.{gate, experts.<e>.{w1, w3, w2}}: the hub's per-expert
// layout, which every transformers version loads (5.x fuses it on load). gate.weight (E, C)
// is our router.weight; w1 (F, C) and w3 (F, C) are the gate and up rows of our
// experts.gate_up[e] (2F, C); w2 (C, F) is our experts.proj[e]. Only Llama-family MoE models
// whose every layer is MoE, with softmax scores renormalized over the top k, no shared expert
// and no expert bias are Mixtrals; the others are refused (hf_tensors) naming the key.
// Qwen3-MoE and OLMoE would express other router settings, but their attention normalizes q
// and k per head (q_norm, k_norm), which ours does not: a model of ours is not one of them.
//
// Embeddings and heads have padded_vocab_size rows here and vocab_size rows there: exports
// drop the padding rows, imports fill them with zeros.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/config.h"
#include "runtime/core/shape.h"
#include "runtime/core/tensor.h"

namespace fsdp::convert {

// One Hugging Face tensor: rows [row_begin, row_begin + rows) of our parameter `ours` seen
// as rows of its last dimension (hf_rows: an expert tensor (E, R, K) is (E * R, K), so
// expert e's rows [r, r + n) are rows [e R + r, e R + r + n)), transposed when `transpose`
// (GPT-2's Conv1D weights).
struct HfTensor {
  std::string name;
  Shape shape;  // Hugging Face's shape
  std::string ours;
  int64_t row_begin = 0;
  int64_t rows = 0;
  bool transpose = false;
};

// Every tensor of the Hugging Face model of `c`, in a fixed order (the tensors cut from one
// parameter follow each other). ConfigError naming the key for an MoE model that no
// Hugging Face architecture we write expresses (see above).
std::vector<HfTensor> hf_tensors(const models::ModelConfig& c);

// Our parameter (contiguous) as the matrix whose rows HfTensor counts: (E, R, K) -> (E * R, K);
// tensors of rank 1 and 2 as they are. A view: writing to it writes the parameter.
Tensor hf_rows(const Tensor& parameter);

// Tensors a Hugging Face checkpoint may hold that carry no weights of ours (GPT-2's causal
// mask buffers, rotary frequency buffers, a stored copy of a tied head).
bool is_ignorable_hf_tensor(const std::string& name, const models::ModelConfig& c);

// config.json for `c`; dtype_name is "float32" or "bfloat16" (the stored weights).
std::string hf_config_json(const models::ModelConfig& c, const std::string& dtype_name);

// The model config.json describes (GPT-2, Llama or Mixtral). ConfigError naming `source` and
// the key for what fsdp.cpp's models cannot express (another activation, attention biases in
// Llama, rope scaling, a head size other than hidden_size / heads, a sliding window or router
// jitter in Mixtral, another model_type, ...). The padded vocabulary is vocab_size rounded up
// to a multiple of 128 unless padded_vocab_size > 0; GPT-2's sequence length is n_positions,
// Llama's and Mixtral's max_position_embeddings. A Mixtral's intermediate_size (each
// expert's hidden size) is also our d_ff, which no layer uses when every layer is MoE.
models::ModelConfig model_config_from_hf(const std::string& config_json, const std::string& source,
                                         int64_t padded_vocab_size = 0);

}  // namespace fsdp::convert
