// The tiny model configs the model tests share.
#pragma once

#include "models/config.h"

namespace fsdp::models {

// Two layers of d 16, 4 heads (Llama: sharing 2 key/value heads), a vocabulary of 30 padded
// to 32, sequences of 8; GPT-2 tied, Llama untied.
inline ModelConfig tiny(Family family) {
  ModelConfig c;
  c.family = family;
  c.n_layer = 2;
  c.d_model = 16;
  c.n_head = 4;
  c.n_kv_head = family == Family::Llama ? 2 : 0;
  c.vocab_size = 30;
  c.padded_vocab_size = 32;
  c.seq_len = 8;
  c.tie_embeddings = family == Family::GPT2;
  return c;
}

// Three layers, MoE at 0 and 2 (4 experts, top 2, hidden 6, a shared expert of 5), dense at 1.
inline ModelConfig tiny_moe(Family family) {
  ModelConfig c = tiny(family);
  c.n_layer = 3;
  c.num_moe_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 6;
  c.moe_shared_expert_intermediate_size = 5;
  c.moe_layer_freq = 2;  // layers 0 and 2
  return c;
}

}  // namespace fsdp::models
