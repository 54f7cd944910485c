// Incremental decoding over a key/value cache: the logits of each new token equal the full
// forward's at its position, and greedy generation with the cache equals greedy generation
// without it token for token (GPT-2 and Llama, f32 and f64, CPU; CUDA against the CPU).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/ops.h"
#include "models/factory.h"
#include "models/generate.h"
#include "models/kv_cache.h"
#include "runtime/nn/init.h"
#include "tests/test_support.h"

namespace fsdp::models {
namespace {

ModelConfig small(Family family) {
  ModelConfig c;
  c.family = family;
  c.n_layer = 2;
  c.d_model = 32;
  c.n_head = 4;
  c.n_kv_head = family == Family::Llama ? 2 : 0;  // grouped-query attention
  c.vocab_size = 50;
  c.padded_vocab_size = 64;
  c.seq_len = 24;
  c.tie_embeddings = family == Family::GPT2;
  c.init_std = 0.2;  // larger weights than training's: sharper, more varied predictions
  return c;
}

std::vector<double> host_f64(Context& ctx, const Tensor& t) {
  return ops::to_vector<double>(ctx, ops::cast(ctx, ops::to_host(ctx, t), DType::f64));
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// The decode logits (Vp) of every position of `tokens`: the first `prompt` at once, then one
// token at a time.
std::vector<std::vector<double>> decoded_logits(Context& ctx, LanguageModel& model,
                                                const std::vector<int32_t>& tokens,
                                                int64_t prompt, DType dtype) {
  KVCache cache(ctx, model.config(), 1, model.config().seq_len, dtype);
  Graph g(ctx);
  autograd::NoGradGuard no_grad(g);
  std::vector<std::vector<double>> rows;
  const std::vector<int32_t> first(tokens.begin(), tokens.begin() + prompt);
  auto decode = [&](const std::vector<int32_t>& ids) {
    const Tensor idx = ops::from_host<int32_t>(ctx, ids, Shape{1, int64_t(ids.size())});
    rows.push_back(host_f64(ctx, model.decode(g, idx, cache)));
  };
  decode(first);
  for (size_t t = size_t(prompt); t < tokens.size(); ++t) {
    decode({tokens[t]});
    CHECK(cache.length == int64_t(t) + 1);
  }
  return rows;
}

// The full forward's logits (Vp) at positions prompt - 1, prompt, ..., T - 1.
std::vector<std::vector<double>> full_logits(Context& ctx, LanguageModel& model,
                                             const std::vector<int32_t>& tokens, int64_t prompt) {
  Graph g(ctx);
  autograd::NoGradGuard no_grad(g);
  const int64_t t = int64_t(tokens.size());
  const Tensor all = model.logits(g, ops::from_host<int32_t>(ctx, tokens, Shape{1, t}));
  std::vector<std::vector<double>> rows;
  for (int64_t p = prompt - 1; p < t; ++p)
    rows.push_back(host_f64(ctx, all.select(0, 0).select(0, p)));
  return rows;
}

std::vector<int32_t> some_tokens(int64_t n) {
  std::vector<int32_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(int32_t((i * 17 + 3) % 50));
  return v;
}

TEST_CASE("decode's logits equal the full forward's at every position", "[models][generate]") {
  Context ctx;
  for (Family f : {Family::GPT2, Family::Llama}) {
    for (DType dtype : {DType::f64, DType::f32}) {
      INFO(family_name(f) << " " << dtype_name(dtype));
      auto model = build_model(small(f));
      nn::materialize(ctx, *model, dtype, 7);
      const std::vector<int32_t> tokens = some_tokens(24);  // the whole context
      const auto decoded = decoded_logits(ctx, *model, tokens, 5, dtype);
      const auto full = full_logits(ctx, *model, tokens, 5);
      REQUIRE(decoded.size() == full.size());
      const double tolerance = dtype == DType::f64 ? 1e-12 : 1e-5;
      for (size_t i = 0; i < full.size(); ++i) {
        INFO("position " << i + 4);
        CHECK(max_abs_diff(decoded[i], full[i]) < tolerance);
      }
    }
  }
}

TEST_CASE("greedy generation with the cache equals greedy generation without it",
          "[models][generate]") {
  Context ctx;
  for (Family f : {Family::GPT2, Family::Llama}) {
    for (DType dtype : {DType::f32, DType::f64}) {
      INFO(family_name(f) << " " << dtype_name(dtype));
      auto model = build_model(small(f));
      nn::materialize(ctx, *model, dtype, 3);
      SampleOptions o;
      o.temperature = 0;
      o.n_tokens = 20;  // 4 + 20 = seq_len: the whole context
      const std::vector<int32_t> without = generate(ctx, *model, {1, 2, 3, 4}, o);
      o.kv_cache = true;
      const std::vector<int32_t> with = generate(ctx, *model, {1, 2, 3, 4}, o);
      CHECK(with == without);
      // Not a degenerate model: it does not repeat one token throughout.
      CHECK(std::count(with.begin(), with.end(), with.front()) < int64_t(with.size()));
    }
  }
}

TEST_CASE("sampling with the cache draws what sampling without it draws (f64)",
          "[models][generate]") {
  Context ctx;
  auto model = build_model(small(Family::Llama));
  nn::materialize(ctx, *model, DType::f64, 9);
  SampleOptions o;
  o.temperature = 0.8;
  o.top_k = 20;
  o.top_p = 0.9;
  o.n_tokens = 16;
  o.seed = 42;
  const std::vector<int32_t> without = generate(ctx, *model, {5}, o);
  o.kv_cache = true;
  CHECK(generate(ctx, *model, {5}, o) == without);
}

TEST_CASE("past the context the cached generation starts again; a full cache is refused",
          "[models][generate]") {
  Context ctx;
  auto model = build_model(small(Family::GPT2));
  nn::materialize(ctx, *model, DType::f32, 4);
  SampleOptions o;
  o.temperature = 0;
  o.n_tokens = 60;  // more than two contexts
  o.kv_cache = true;
  const std::vector<int32_t> out = generate(ctx, *model, some_tokens(30), o);  // a long prompt
  CHECK(out.size() == 60);
  for (int32_t id : out) CHECK((id >= 0 && id < 50));

  KVCache cache(ctx, model->config(), 1, 4, DType::f32);
  Graph g(ctx);
  {
    // Gradients on: refused, nothing is recorded.
    CHECK_THROWS_AS(model->decode(g, ops::from_host<int32_t>(ctx, {1}, Shape{1, 1}), cache),
                    ValueError);
  }
  autograd::NoGradGuard no_grad(g);
  model->decode(g, ops::from_host<int32_t>(ctx, {1, 2, 3}, Shape{1, 3}), cache);
  CHECK_THROWS_AS(model->decode(g, ops::from_host<int32_t>(ctx, {4, 5}, Shape{1, 2}), cache),
                  IndexError);
  CHECK(cache.length == 3);
}

TEST_CASE("sample_token: top-p keeps the fewest most likely tokens reaching p",
          "[models][generate]") {
  // Probabilities about 0.64, 0.24, 0.09, 0.03 for ids 2, 0, 3, 1.
  const std::vector<double> logits = {1.0, -1.0, 2.0, 0.0};
  // p = 0.5: only id 2, whatever the draw.
  CHECK(sample_token(logits, 1.0, 0, 0.0, 0.5) == 2);
  CHECK(sample_token(logits, 1.0, 0, 0.999, 0.5) == 2);
  // p = 0.8: ids 2 and 0, renormalized: 2 below 0.64/0.88, 0 above.
  const double e2 = std::exp(2.0), e1 = std::exp(1.0);
  CHECK(sample_token(logits, 1.0, 0, e2 / (e2 + e1) - 1e-9, 0.8) == 2);
  CHECK(sample_token(logits, 1.0, 0, e2 / (e2 + e1) + 1e-9, 0.8) == 0);
  CHECK(sample_token(logits, 1.0, 0, 0.999999, 0.8) == 0);
  // p = 1 changes nothing.
  CHECK(sample_token(logits, 1.0, 0, 0.999999, 1.0) == 1);
  CHECK_THROWS_AS(sample_token(logits, 1.0, 0, 0.5, 0.0), ValueError);
  CHECK_THROWS_AS(sample_token(logits, 1.0, 0, 0.5, 1.5), ValueError);
}

TEST_CASE("decode on CUDA matches the CPU (f32)", "[models][generate][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu;
  Context gpu(Device::cuda(0));
  for (Family f : {Family::GPT2, Family::Llama}) {
    INFO(family_name(f));
    auto on_gpu = build_model(small(f));
    auto on_cpu = build_model(small(f));
    nn::materialize(gpu, *on_gpu, DType::f32, 13);
    const std::vector<nn::Parameter*> gp = on_gpu->named_parameters();
    const std::vector<nn::Parameter*> cp = on_cpu->named_parameters();
    for (size_t i = 0; i < gp.size(); ++i) cp[i]->data = ops::to_host(gpu, gp[i]->data);
    const std::vector<int32_t> tokens = some_tokens(24);
    const auto g = decoded_logits(gpu, *on_gpu, tokens, 6, DType::f32);
    const auto c = decoded_logits(cpu, *on_cpu, tokens, 6, DType::f32);
    const auto full = full_logits(gpu, *on_gpu, tokens, 6);
    for (size_t i = 0; i < c.size(); ++i) {
      INFO("step " << i);
      CHECK(max_abs_diff(g[i], c[i]) < 1e-4);
      CHECK(max_abs_diff(g[i], full[i]) < 1e-4);
    }
    SampleOptions o;
    o.temperature = 0;
    o.n_tokens = 18;
    const std::vector<int32_t> without = generate(gpu, *on_gpu, {1, 2, 3, 4, 5, 6}, o);
    o.kv_cache = true;
    CHECK(generate(gpu, *on_gpu, {1, 2, 3, 4, 5, 6}, o) == without);
  }
}

}  // namespace
}  // namespace fsdp::models
