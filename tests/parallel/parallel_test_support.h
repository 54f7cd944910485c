// What the tests of the model-parallel layers share: a tiny model, and a one-rank group.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "models/config.h"
#include "runtime/nn/tensor_parallel.h"

namespace fsdp::testing {

// A tiny GPT-2 or Llama (2 layers, d_model 16, 4 heads, 8 positions, a vocabulary of 29
// padded to 32); Llama has `kv_heads` key/value heads and an untied head.
inline models::ModelConfig tiny_parallel_model(models::Family family, int64_t kv_heads = 2) {
  models::ModelConfig c;
  c.family = family;
  c.n_layer = 2;
  c.d_model = 16;
  c.n_head = 4;
  c.n_kv_head = family == models::Family::Llama ? kv_heads : 0;
  c.d_ff = family == models::Family::Llama ? 24 : 0;
  c.vocab_size = 29;
  c.padded_vocab_size = 32;
  c.seq_len = 8;
  c.tie_embeddings = family == models::Family::GPT2;
  return c;
}

// Token ids (or targets) of a tiny batch: element i is (i * mul + add) % 29.
inline std::vector<int32_t> tiny_tokens(int64_t n, int mul, int add) {
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = int32_t((i * mul + add) % 29);
  return out;
}

// A tensor's elements as doubles.
inline std::vector<double> values(Context& ctx, const Tensor& t) {
  return ops::to_vector<double>(ctx, ops::cast(ctx, t, DType::f64));
}

// A one-rank group: what the parallel ops do on one device, whatever the group's size (the
// collectives are the communicators' job, tested on CPU ranks): sums leave their input,
// gathers, scatters and ring steps copy it.
struct LocalGroup : nn::ParallelGroup {
  int size() const override { return 1; }
  int rank() const override { return 0; }
  void all_reduce_sum(Context&, const Tensor&) override {}
  void all_reduce_max(Context&, const Tensor&) override {}
  void all_gather(Context& ctx, const Tensor& out, const Tensor& in) override { ops::copy(ctx, out, in); }
  void reduce_scatter_sum(Context& ctx, const Tensor& out, const Tensor& in) override {
    ops::copy(ctx, out, in);
  }
  void send_recv(Context& ctx, const Tensor& send, int, const Tensor& recv, int) override {
    ops::copy(ctx, recv, send);
  }
};

}  // namespace fsdp::testing
