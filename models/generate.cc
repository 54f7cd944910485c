#include "models/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/ops.h"

namespace fsdp::models {
namespace {

// splitmix64: a small, fully specified generator (the same stream on every platform).
class HostRng {
 public:
  explicit HostRng(uint64_t seed) : state_(seed) {}
  double uniform() {  // [0, 1) with 53 random bits
    return double(next() >> 11) * (1.0 / 9007199254740992.0);
  }

 private:
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

}  // namespace

int32_t sample_token(const std::vector<double>& logits, double temperature, int64_t top_k,
                     double uniform, double top_p) {
  FSDP_CHECK(!logits.empty(), ValueError, "sample_token: no logits");
  FSDP_CHECK(top_p > 0 && top_p <= 1, ValueError, "sample_token: top_p must be in (0, 1], got ",
             top_p);
  const int64_t v = int64_t(logits.size());
  if (temperature <= 0 || top_k == 1)
    return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  // Candidates: the k largest (ties broken by the lower id), most likely first.
  std::vector<int32_t> ids(static_cast<size_t>(v));
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t k = (top_k <= 0 || top_k > v) ? v : top_k;
  auto more_likely = [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), more_likely);
  ids.resize(size_t(k));
  // Softmax of logits / temperature over the candidates, then invert the CDF.
  const double top = logits[size_t(ids[0])];
  std::vector<double> p(static_cast<size_t>(k));
  double total = 0;
  for (int64_t i = 0; i < k; ++i) {
    p[size_t(i)] = std::exp((logits[size_t(ids[size_t(i)])] - top) / temperature);
    total += p[size_t(i)];
  }
  // Top-p: keep the most likely candidates until their probability reaches top_p.
  int64_t kept = k;
  if (top_p < 1) {
    double mass = 0;
    for (int64_t i = 0; i < k; ++i) {
      mass += p[size_t(i)] / total;
      if (mass >= top_p) {
        kept = i + 1;
        break;
      }
    }
    total = 0;
    for (int64_t i = 0; i < kept; ++i) total += p[size_t(i)];
  }
  double acc = 0;
  for (int64_t i = 0; i < kept; ++i) {
    acc += p[size_t(i)] / total;
    if (uniform < acc) return ids[size_t(i)];
  }
  return ids[size_t(kept - 1)];  // rounding left the draw just above the last bucket's end
}

std::vector<int32_t> generate(Context& ctx, LanguageModel& model,
                              const std::vector<int32_t>& prompt, const SampleOptions& options) {
  const ModelConfig& c = model.config();
  FSDP_CHECK(!prompt.empty(), ValueError, "generate: the prompt needs at least one token");
  for (int32_t id : prompt)
    FSDP_CHECK(id >= 0 && id < c.vocab_size, ValueError, "generate: prompt token ", id,
               " is outside the vocabulary of ", c.vocab_size);
  HostRng rng(options.seed);
  std::vector<int32_t> tokens = prompt;
  std::vector<int32_t> out;
  Graph g(ctx);
  autograd::NoGradGuard no_grad(g);
  // The next token from a (Vp) row of logits.
  auto choose = [&](const Tensor& row_vp) {
    const Tensor real = row_vp.narrow(0, 0, c.vocab_size);
    const std::vector<double> row = ops::to_vector<double>(ctx, ops::cast(ctx, real, DType::f64));
    return sample_token(row, options.temperature, options.top_k, rng.uniform(), options.top_p);
  };
  if (options.kv_cache) {
    const DType dtype = model.named_parameters().front()->checked_data().dtype();
    KVCache cache(ctx, c, /*batch=*/1, /*capacity=*/c.seq_len, dtype);
    std::vector<int32_t> pending = tokens;  // read into the cache at the next step
    if (int64_t(pending.size()) > c.seq_len)
      pending.erase(pending.begin(), pending.end() - c.seq_len / 2);
    for (int64_t step = 0; step < options.n_tokens; ++step) {
      if (cache.length + int64_t(pending.size()) > cache.capacity) {
        // Full: start again from the last seq_len / 2 tokens (at least the pending one).
        cache.length = 0;
        const int64_t keep = std::max<int64_t>(c.seq_len / 2, 1);
        pending.assign(tokens.end() - std::min<int64_t>(keep, int64_t(tokens.size())),
                       tokens.end());
      }
      const int64_t n = int64_t(pending.size());
      const Tensor logits =
          model.decode(g, ops::from_host<int32_t>(ctx, pending, Shape{1, n}), cache);  // (1, Vp)
      const int32_t next = choose(logits.select(0, 0));  // (Vp)
      tokens.push_back(next);
      out.push_back(next);
      pending.assign(1, next);
    }
    return out;
  }
  for (int64_t step = 0; step < options.n_tokens; ++step) {
    const int64_t t = std::min<int64_t>(int64_t(tokens.size()), c.seq_len);
    const std::vector<int32_t> window(tokens.end() - t, tokens.end());
    const Tensor idx = ops::from_host<int32_t>(ctx, window, Shape{1, t});  // (1, T)
    const Tensor logits = model.logits(g, idx);                            // (1, T, Vp)
    const int32_t next = choose(logits.select(0, 0).select(0, t - 1));  // the last position
    tokens.push_back(next);
    out.push_back(next);
  }
  return out;
}

}  // namespace fsdp::models
