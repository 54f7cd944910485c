// CPU fused cross-entropy, fused AdamW and the counter-based initializers.
#include <cmath>

#include "kernels/ops.h"
#include "tests/kernels/nn_test_util.h"
#include "tests/test_support.h"

using namespace fsdp;
using fsdp::testing::max_rel_diff;
using fsdp::testing::numeric_grad;
using fsdp::testing::random_tensor;
using fsdp::testing::values;

TEST_CASE("cross-entropy: padded columns excluded, ignored rows, in-place backward",
          "[kernels][nn]") {
  Context ctx;
  const int64_t N = 4, V = 6, Vp = 8;
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(dtype_name(dt));
    Tensor logits = random_tensor(ctx, Shape{N, Vp}, dt, 1, -3, 3);
    // Huge values in the padding: they would dominate the softmax if they were included.
    ops::fill(ctx, logits.slice(1, V, Vp), 50.0);
    Tensor targets = ops::from_host<int32_t>(ctx, {2, -1, 5, 0}, Shape{N});
    Tensor losses = ops::empty(ctx, Shape{N}, dt), lse = ops::empty(ctx, Shape{N}, dt);
    ops::cross_entropy_forward(ctx, losses, lse, logits, targets, V);
    const auto x = values(ctx, logits);
    const std::vector<int> t = {2, -1, 5, 0};
    std::vector<double> want_lse(size_t(N), 0.0), want_loss(size_t(N), 0.0);
    for (int64_t n = 0; n < N; ++n) {
      double z = 0;
      for (int64_t c = 0; c < V; ++c) z += std::exp(x[size_t(n * Vp + c)]);
      want_lse[size_t(n)] = std::log(z);
      want_loss[size_t(n)] = t[size_t(n)] < 0 ? 0.0 : std::log(z) - x[size_t(n * Vp + t[size_t(n)])];
    }
    const double tol = dt == DType::f32 ? 1e-6 : 1e-14;
    CHECK(max_rel_diff(values(ctx, lse), want_lse, 1.0) < tol);
    CHECK(max_rel_diff(values(ctx, losses), want_loss, 1.0) < tol);
    CHECK(values(ctx, losses)[1] == 0.0);

    // Backward in place: dlogits is the logits tensor.
    const double dloss = 1.0 / 3;  // the mean over the 3 counted rows
    ops::cross_entropy_backward(ctx, logits, logits, lse, targets, V, dloss);
    const auto g = values(ctx, logits);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < Vp; ++c) {
        double want = 0;
        if (t[size_t(n)] >= 0 && c < V)
          want = (std::exp(x[size_t(n * Vp + c)] - want_lse[size_t(n)]) - (c == t[size_t(n)])) * dloss;
        CHECK(g[size_t(n * Vp + c)] == Approx(want).margin(tol));
      }
  }
  // The backward is the gradient of dloss * sum(losses): finite differences in f64.
  Tensor logits = random_tensor(ctx, Shape{3, 5}, DType::f64, 2, -2, 2);
  Tensor targets = ops::from_host<int32_t>(ctx, {3, 1, -1}, Shape{3});
  Tensor losses = ops::empty(ctx, Shape{3}, DType::f64), lse = ops::empty(ctx, Shape{3}, DType::f64);
  auto loss = [&] {
    ops::cross_entropy_forward(ctx, losses, lse, logits, targets, 4);
    const auto l = values(ctx, losses);
    return 0.7 * (l[0] + l[1] + l[2]);
  };
  const auto fd = numeric_grad(logits, loss);
  loss();
  Tensor dlogits = ops::empty(ctx, logits.shape(), DType::f64);
  ops::cross_entropy_backward(ctx, dlogits, logits, lse, targets, 4, 0.7);
  CHECK(max_rel_diff(values(ctx, dlogits), fd, 1.0) < 1e-7);

  Tensor bad = ops::from_host<int32_t>(ctx, {4, 1, 5}, Shape{3});
  CHECK_THROWS_AS(ops::cross_entropy_forward(ctx, losses, lse, logits, bad, 4), IndexError);
  CHECK_THROWS_AS(ops::cross_entropy_forward(ctx, losses, lse, logits, targets, 6), ValueError);
}

TEST_CASE("cross-entropy forward-backward in one pass equals forward then backward",
          "[kernels][nn]") {
  Context ctx;
  const int64_t N = 5, V = 7, Vp = 9;
  const std::vector<int32_t> t = {6, -1, 0, 3, -1};
  Tensor targets = ops::from_host<int32_t>(ctx, t, Shape{N});
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(dtype_name(dt));
    Tensor logits = random_tensor(ctx, Shape{N, Vp}, dt, 3, -4, 4);
    ops::fill(ctx, logits.slice(1, V, Vp), 40.0);  // padding: excluded from the softmax
    // The two-kernel reference on a copy.
    Tensor ref = ops::clone(ctx, logits);
    Tensor ref_losses = ops::empty(ctx, Shape{N}, dt), lse = ops::empty(ctx, Shape{N}, dt);
    ops::cross_entropy_forward(ctx, ref_losses, lse, ref, targets, V);
    const double dloss = 0.37;
    ops::cross_entropy_backward(ctx, ref, ref, lse, targets, V, dloss);

    // Losses only: the logits must come back untouched.
    const std::vector<double> before = values(ctx, logits);
    Tensor losses = ops::full(ctx, Shape{N}, dt, -5.0);
    ops::cross_entropy_forward_backward(ctx, losses, logits, targets, V, dloss, false);
    CHECK(values(ctx, logits) == before);
    CHECK(values(ctx, losses) == values(ctx, ref_losses));

    // Both: the same losses, and the logits replaced by their gradient. The reference's
    // backward reads the log-sum-exp rounded to the stored dtype, this one the exact value:
    // equal to that rounding.
    ops::fill(ctx, losses, -5.0);
    ops::cross_entropy_forward_backward(ctx, losses, logits, targets, V, dloss, true);
    CHECK(values(ctx, losses) == values(ctx, ref_losses));
    const double tol = dt == DType::f32 ? 1e-6 : 1e-15;
    CHECK(max_rel_diff(values(ctx, logits), values(ctx, ref), 1.0) < tol);
    const std::vector<double> g = values(ctx, logits);
    for (int64_t c = 0; c < Vp; ++c) {
      CHECK(g[size_t(1 * Vp + c)] == 0.0);  // ignored rows
      CHECK(g[size_t(4 * Vp + c)] == 0.0);
    }
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = V; c < Vp; ++c) CHECK(g[size_t(n * Vp + c)] == 0.0);  // padding
    // Each counted row's gradient sums to 0 (softmax sums to 1, minus the one-hot).
    double row_sum = 0;
    for (int64_t c = 0; c < Vp; ++c) row_sum += g[size_t(3 * Vp + c)];
    CHECK(std::fabs(row_sum) < 1e-6);
    CHECK(g[size_t(3 * Vp + 3)] < 0.0);  // the target's entry: p - 1
  }
  Tensor logits = random_tensor(ctx, Shape{N, Vp}, DType::f32, 4);
  Tensor losses = ops::empty(ctx, Shape{N}, DType::f32);
  Tensor bad = ops::from_host<int32_t>(ctx, {0, 1, 7, 2, 3}, Shape{N});  // 7 = V
  CHECK_THROWS_AS(ops::cross_entropy_forward_backward(ctx, losses, logits, bad, V, 1.0, true),
                  IndexError);
  CHECK_THROWS_AS(ops::cross_entropy_forward_backward(ctx, losses, logits, targets, Vp + 1, 1.0,
                                                      true),
                  ValueError);
  Tensor short_losses = ops::empty(ctx, Shape{N - 1}, DType::f32);
  CHECK_THROWS_AS(ops::cross_entropy_forward_backward(ctx, short_losses, logits, targets, V, 1.0,
                                                      true),
                  ShapeError);
}

namespace {

// PyTorch's AdamW, written out step by step.
struct RefAdamW {
  std::vector<double> p, m, v;
  void step(const std::vector<double>& grad, const ops::AdamWParams& a) {
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = grad[i] * a.grad_scale;
      p[i] *= 1 - a.lr * a.weight_decay;
      m[i] = a.beta1 * m[i] + (1 - a.beta1) * g;
      v[i] = a.beta2 * v[i] + (1 - a.beta2) * g * g;
      const double mhat = m[i] / (1 - std::pow(a.beta1, a.step));
      const double vhat = v[i] / (1 - std::pow(a.beta2, a.step));
      p[i] -= a.lr * mhat / (std::sqrt(vhat) + a.eps);
    }
  }
};

}  // namespace

TEST_CASE("vocabulary-parallel cross-entropy: merged shard statistics equal the whole row's",
          "[kernels][nn]") {
  Context ctx;
  // V = 10 classes padded to 12, in shards of 4 columns: [0, 4), [4, 8), [8, 12), the last
  // holding classes 8 and 9 and two padding columns; then a shard of padding only.
  const int64_t N = 5, V = 10, Vp = 12, S = 4;
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(dtype_name(dt));
    Tensor logits = random_tensor(ctx, Shape{N, Vp}, dt, 7, -4, 4);
    ops::fill(ctx, logits.slice(1, V, Vp), 50.0);  // padding: must not count
    Tensor targets = ops::from_host<int32_t>(ctx, {9, -1, 0, 5, 4}, Shape{N});
    Tensor want_losses = ops::empty(ctx, Shape{N}, dt), want_lse = ops::empty(ctx, Shape{N}, dt);
    ops::cross_entropy_forward(ctx, want_losses, want_lse, logits, targets, V);
    Tensor want_grad = ops::empty(ctx, Shape{N, Vp}, dt);
    ops::cross_entropy_backward(ctx, want_grad, logits, want_lse, targets, V, 0.25);

    Tensor partials = ops::empty(ctx, Shape{3, 3, N}, dt);  // (shards, 3, N)
    std::vector<Tensor> shards;
    for (int64_t s = 0; s < 3; ++s) {
      shards.push_back(ops::contiguous(ctx, logits.slice(1, s * S, (s + 1) * S)));  // (N, S)
      ops::cross_entropy_shard_stats(ctx, partials.select(0, s), shards.back(), targets, V, s * S);
    }
    Tensor losses = ops::empty(ctx, Shape{N}, dt), lse = ops::empty(ctx, Shape{N}, dt);
    ops::cross_entropy_merge_shards(ctx, losses, lse, partials, targets);
    const double tol = dt == DType::f32 ? 1e-6 : 1e-14;
    CHECK(max_rel_diff(values(ctx, lse), values(ctx, want_lse), 1.0) < tol);
    CHECK(max_rel_diff(values(ctx, losses), values(ctx, want_losses), 1.0) < tol);
    CHECK(values(ctx, losses)[1] == 0.0);
    // Each shard's columns of the gradient, in place, with the merged log-sum-exp.
    for (int64_t s = 0; s < 3; ++s) {
      ops::cross_entropy_shard_backward(ctx, shards[size_t(s)], shards[size_t(s)], lse, targets, V,
                                        s * S, 0.25);
      const Tensor want = ops::contiguous(ctx, want_grad.slice(1, s * S, (s + 1) * S));
      CHECK(max_rel_diff(values(ctx, shards[size_t(s)]), values(ctx, want), 1.0) < tol);
    }
    // A shard past the classes holds none: max -inf, sum 0, no target logit; merging it
    // changes nothing.
    Tensor pad = ops::full(ctx, Shape{N, 2}, dt, 3.0);
    Tensor pad_stats = ops::empty(ctx, Shape{3, N}, dt);
    ops::cross_entropy_shard_stats(ctx, pad_stats, pad, targets, V, 12);
    const auto ps = values(ctx, pad_stats);
    for (int64_t n = 0; n < N; ++n) {
      CHECK(ps[size_t(n)] == -INFINITY);
      CHECK(ps[size_t(N + n)] == 0.0);
      CHECK(ps[size_t(2 * N + n)] == 0.0);
    }
    Tensor four = ops::empty(ctx, Shape{4, 3, N}, dt);
    ops::copy(ctx, four.narrow(0, 0, 3), partials);
    ops::copy(ctx, four.select(0, 3), pad_stats);
    ops::cross_entropy_merge_shards(ctx, losses, lse, four, targets);
    CHECK(max_rel_diff(values(ctx, losses), values(ctx, want_losses), 1.0) < tol);
    // A target outside the vocabulary is refused.
    Tensor bad = ops::from_host<int32_t>(ctx, {10, 0, 0, 0, 0}, Shape{N});
    CHECK_THROWS_AS(ops::cross_entropy_shard_stats(ctx, pad_stats, shards[0], bad, V, 0), IndexError);
  }
}

TEST_CASE("adamw_step follows PyTorch's AdamW, with bias correction from step 1",
          "[kernels][nn]") {
  Context ctx;
  const int64_t n = 50;
  ops::AdamWParams a;
  a.lr = 1e-2;
  a.weight_decay = 0.1;
  a.grad_scale = 0.5;
  for (DType pd : {DType::f32, DType::f64}) {
    INFO(dtype_name(pd));
    Tensor p = random_tensor(ctx, Shape{n}, pd, 1);
    Tensor m = ops::zeros(ctx, Shape{n}, pd), v = ops::zeros(ctx, Shape{n}, pd);
    Tensor copy = ops::empty(ctx, Shape{n}, DType::bf16);
    RefAdamW ref{values(ctx, p), std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
    for (int64_t s = 1; s <= 3; ++s) {
      a.step = s;
      Tensor g = random_tensor(ctx, Shape{n}, DType::f32, uint32_t(10 + s), -2, 2);
      ops::adamw_step(ctx, p, g, m, v, a, copy);
      ref.step(values(ctx, g), a);
    }
    const double tol = pd == DType::f32 ? 1e-6 : 1e-14;
    CHECK(max_rel_diff(values(ctx, p), ref.p, 1.0) < tol);
    CHECK(max_rel_diff(values(ctx, m), ref.m, 1.0) < tol);
    CHECK(max_rel_diff(values(ctx, v), ref.v, 1e-3) < tol);
    // The copy is the updated parameter rounded to bf16.
    const auto pv = values(ctx, p), cv = values(ctx, copy);
    for (int64_t i = 0; i < n; ++i) CHECK(cv[size_t(i)] == double(float(bf16(float(pv[size_t(i)])))));
  }
  // Step-1 magnitude, explicitly: no decay, zero moments, gradient 3 -> update of exactly lr.
  Tensor p = ops::zeros(ctx, Shape{4}, DType::f32);
  Tensor m = ops::zeros(ctx, Shape{4}, DType::f32), v = ops::zeros(ctx, Shape{4}, DType::f32);
  ops::AdamWParams b;
  b.lr = 0.1;
  b.eps = 0;
  b.step = 1;
  ops::adamw_step(ctx, p, ops::full(ctx, Shape{4}, DType::f32, 3.0), m, v, b);
  CHECK(values(ctx, p)[0] == Approx(-0.1).epsilon(1e-6));
  // bf16 moments.
  Tensor mb = ops::zeros(ctx, Shape{4}, DType::bf16), vb = ops::zeros(ctx, Shape{4}, DType::bf16);
  ops::adamw_step(ctx, p, ops::full(ctx, Shape{4}, DType::bf16, 3.0), mb, vb, b);
  CHECK(values(ctx, mb)[0] == Approx(0.3).epsilon(1e-2));
  CHECK(values(ctx, p)[0] == Approx(-0.2).epsilon(1e-2));
  b.step = 0;
  CHECK_THROWS_AS(ops::adamw_step(ctx, p, p, m, v, b), ValueError);
}

TEST_CASE("adamw_step_host_f32 (CPU offload) follows PyTorch's AdamW in f32", "[kernels][nn]") {
  Context ctx;
  const int64_t n = 1003;  // not a multiple of the vector width
  ops::AdamWParams a;
  a.lr = 1e-2;
  a.weight_decay = 0.1;
  a.grad_scale = 0.5;
  for (DType moments : {DType::f32, DType::bf16}) {
    for (DType grads : {DType::f32, DType::bf16}) {
      INFO("moments " << dtype_name(moments) << " grads " << dtype_name(grads));
      Tensor p = random_tensor(ctx, Shape{n}, DType::f32, 1);
      Tensor m = ops::zeros(ctx, Shape{n}, moments), v = ops::zeros(ctx, Shape{n}, moments);
      Tensor copy = ops::empty(ctx, Shape{n}, DType::bf16);
      RefAdamW ref{values(ctx, p), std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
      for (int64_t s = 1; s <= 3; ++s) {
        a.step = s;
        Tensor g = random_tensor(ctx, Shape{n}, grads, uint32_t(10 + s), -2, 2);
        ops::adamw_step_host_f32(ctx, p, g, m, v, a, copy);
        ref.step(values(ctx, g), a);
      }
      // f32 arithmetic on O(1) weights moved by ~lr: within 1e-6 of the scale. bf16 moments
      // carry 2^-8 relative rounding into each step's update of ~lr = 1e-2: ~1e-4.
      const double tol = moments == DType::f32 ? 1e-6 : 2e-4;
      CHECK(max_rel_diff(values(ctx, p), ref.p, 1.0) < tol);
      const auto pv = values(ctx, p), cv = values(ctx, copy);
      for (int64_t i = 0; i < n; ++i) CHECK(cv[size_t(i)] == double(float(bf16(float(pv[size_t(i)])))));
    }
  }
  // f64 master weights belong to the reference kernel, not this one.
  Tensor p64 = ops::zeros(ctx, Shape{4}, DType::f64);
  Tensor m = ops::zeros(ctx, Shape{4}, DType::f32);
  a.step = 1;
  CHECK_THROWS_AS(ops::adamw_step_host_f32(ctx, p64, m, m, m, a), DTypeError);
}

TEST_CASE("init_normal / init_uniform are slice-invariant and have the right moments",
          "[kernels][nn]") {
  Context ctx;
  const uint64_t seed = 1234, key = ops::name_key("h.0.attn.c_attn.weight");
  const int64_t n = 200001;  // odd: the last normal is the first half of a Box-Muller pair
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor full = ops::empty(ctx, Shape{n}, dt);
    ops::init_normal(ctx, full, seed, key, 0, 0.5, 0.02);
    // Any slice, odd or even offset, alone equals the same slice of the full init.
    for (int64_t off : {int64_t(0), int64_t(1), int64_t(777), n - 5}) {
      const int64_t len = std::min<int64_t>(1001, n - off);
      Tensor part = ops::empty(ctx, Shape{len}, dt);
      ops::init_normal(ctx, part, seed, key, off, 0.5, 0.02);
      CHECK(values(ctx, part) == values(ctx, full.narrow(0, off, len)));
    }
    const auto v = values(ctx, full);
    double mean = 0, var = 0;
    for (double x : v) mean += x / double(n);
    for (double x : v) var += (x - mean) * (x - mean) / double(n);
    // Sampling error of the mean: 0.02 / sqrt(n) = 4.5e-5; of the std: 0.02 / sqrt(2n) = 3e-5.
    CHECK(std::fabs(mean - 0.5) < 5 * 4.5e-5);
    CHECK(std::fabs(std::sqrt(var) - 0.02) < 5 * 3.2e-5);
    // Other keys and seeds give other streams; repeated calls the same one.
    Tensor other = ops::empty(ctx, Shape{16}, dt), same = ops::empty(ctx, Shape{16}, dt);
    ops::init_normal(ctx, other, seed, key + 1, 0, 0.5, 0.02);
    ops::init_normal(ctx, same, seed, key, 0, 0.5, 0.02);
    CHECK(values(ctx, other) != values(ctx, full.narrow(0, 0, 16)));
    CHECK(values(ctx, same) == values(ctx, full.narrow(0, 0, 16)));
    ops::init_normal(ctx, other, seed + 1, key, 0, 0.5, 0.02);
    CHECK(values(ctx, other) != values(ctx, same));

    Tensor u = ops::empty(ctx, Shape{n}, dt);
    ops::init_uniform(ctx, u, seed, key, 0, -0.1, 0.3);
    const auto uv = values(ctx, u);
    double umean = 0, lo = 1, hi = -1;
    for (double x : uv) {
      umean += x / double(n);
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    CHECK(lo >= -0.1);
    CHECK(hi <= 0.3);
    CHECK(hi - lo > 0.399);
    CHECK(std::fabs(umean - 0.1) < 5 * 0.4 / std::sqrt(12.0 * n));
    Tensor upart = ops::empty(ctx, Shape{10}, dt);
    ops::init_uniform(ctx, upart, seed, key, 12345, -0.1, 0.3);
    CHECK(values(ctx, upart) == values(ctx, u.narrow(0, 12345, 10)));
  }
  CHECK(ops::name_key("a") == 0xaf63dc4c8601ec8cull);  // FNV-1a test vector
  CHECK(ops::name_key("wte") != ops::name_key("wpe"));
}

// The quintic Newton-Schulz iteration acts on each singular value alone: for a matrix
// P diag(s) Q with P, Q signed permutations (orthogonal, exact in floating point), the result
// is P diag(f(s / |s|)) Q where f is the scalar polynomial a x + b x^3 + c x^5 applied
// `steps` times. Wide and tall (the tall one iterated on its transpose), f64 and f32.
TEST_CASE("newton_schulz orthogonalizes singular value by singular value", "[kernels][nn][muon]") {
  Context ctx;
  const ops::NewtonSchulzScalars ns;
  for (DType dt : {DType::f64, DType::f32}) {
    for (bool tall : {false, true}) {
      INFO(dtype_name(dt) << (tall ? " tall" : " wide"));
      const int64_t m = 5, n = 8, rows = tall ? n : m, cols = tall ? m : n;
      const std::vector<double> s = {3.0, 1.0, 0.5, 0.25, 0.01};
      double norm = 0;
      for (double v : s) norm += v * v;
      norm = std::sqrt(norm);
      // Singular value i sits at (row_of(i), col_of(i)) with sign sign_of(i).
      // i -> (2i + 1) mod m is a permutation of the short side, i -> (3i + 2) mod n injective.
      auto short_of = [&](int64_t i) { return (2 * i + 1) % m; };
      auto long_of = [&](int64_t i) { return (3 * i + 2) % n; };
      auto row_of = [&](int64_t i) { return tall ? long_of(i) : short_of(i); };
      auto col_of = [&](int64_t i) { return tall ? short_of(i) : long_of(i); };
      auto sign_of = [](int64_t i) { return i % 2 == 0 ? 1.0 : -1.0; };
      std::vector<double> x(size_t(rows * cols), 0.0);
      for (int64_t i = 0; i < m; ++i) x[size_t(row_of(i) * cols + col_of(i))] = sign_of(i) * s[size_t(i)];
      const Tensor in = ops::cast(ctx, ops::from_host<double>(ctx, x, Shape{rows, cols}), dt);
      const Tensor out = ops::empty(ctx, Shape{rows, cols}, dt);
      ops::newton_schulz(ctx, in, out, ns);
      std::vector<double> want(size_t(rows * cols), 0.0);
      for (int64_t i = 0; i < m; ++i) {
        double v = s[size_t(i)] / norm;
        for (int k = 0; k < ns.steps; ++k) v = ns.a * v + ns.b * v * v * v + ns.c * v * v * v * v * v;
        want[size_t(row_of(i) * cols + col_of(i))] = sign_of(i) * v;
      }
      const std::vector<double> got = values(ctx, out);
      const double tol = dt == DType::f64 ? 1e-13 : 1e-5;
      for (size_t k = 0; k < got.size(); ++k) CHECK(std::abs(got[k] - want[k]) <= tol);
      // The iteration pulls every singular value above 0.01 into [0.6, 1.2].
      for (int64_t i = 0; i < m; ++i) {
        const double v = std::abs(got[size_t(row_of(i) * cols + col_of(i))]);
        CHECK(v > 0.6);
        CHECK(v < 1.2);
      }
    }
  }
}
