// The distinct linear layers of one transformer block and the output head of a recipe's
// model at its micro-batch, as the matmul benchmarks time them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/train/recipe.h"

namespace fsdp::bench {

// One linear layer of the model: x (rows, in) @ w (out, in)^T.
struct LinearShape {
  const char* name;
  int64_t rows, in, out;
  bool bias;
  bool gelu_after;   // forward: GELU epilogue saving the pre-activation (GPT-2's fc)
  bool dgelu_input;  // dgrad: the GELU gradient of the layer before fused in (GPT-2's proj)
  bool head;         // the output head (kept in bf16 under fp8)
};

// rows = micro_batch_size x seq_length; the head's rows are one classifier chunk.
inline std::vector<LinearShape> linear_shapes_of(const train::Recipe& r) {
  const train::ModelSection& m = r.model;
  const int64_t rows = int64_t(r.train.micro_batch_size) * m.seq_length;
  const int64_t chunk = m.classifier_chunk_rows > 0 ? std::min<int64_t>(rows, m.classifier_chunk_rows)
                                                    : rows;
  const int64_t c = m.d_model, f = m.d_ff, v = m.padded_vocab_size;
  if (m.family == "gpt2")
    return {{"qkv", rows, c, 3 * c, true, false, false, false},
            {"attention proj", rows, c, c, true, false, false, false},
            {"fc (+GELU)", rows, c, f, true, true, false, false},
            {"proj (dGELU)", rows, f, c, true, false, true, false},
            {"head", chunk, c, v, false, false, false, true}};
  const int64_t kv = c / m.n_head * m.n_kv_head;
  return {{"qkv", rows, c, c + 2 * kv, false, false, false, false},
          {"attention out", rows, c, c, false, false, false, false},
          {"gate+up", rows, c, 2 * f, false, false, false, false},
          {"down", rows, f, c, false, false, false, false},
          {"head", chunk, c, v, false, false, false, true}};
}

// The recipes the matmul benchmarks know by name.
inline const std::map<std::string, std::string>& matmul_bench_workloads() {
  static const std::map<std::string, std::string> kWorkloads = {
      {"gpt2-124m", "configs/gpt2-124m.json"},
      {"gpt-1.3b", "configs/gpt-1.3b.json"},
      {"llama-1b", "configs/llama-1b.json"}};
  return kWorkloads;
}

}  // namespace fsdp::bench
