// CPU mixture-of-experts kernels against hand-checked routing and direct formulas, with
// every backward checked against f64 central differences: the router (softmax and sigmoid,
// with and without normalization, k = 1 .. E), the grouping by expert, the permutation and
// the combine, the grouped matmul with experts that get no rows, and all of them chained.
#include <cmath>
#include <vector>

#include "kernels/ops.h"
#include "tests/kernels/nn_test_util.h"
#include "tests/test_support.h"

using namespace fsdp;
using fsdp::testing::max_rel_diff;
using fsdp::testing::numeric_grad;
using fsdp::testing::random_tensor;
using fsdp::testing::values;
using fsdp::testing::weighted_sum;

namespace {

using fsdp::testing::kFdTol;
// Differences carry ~1e-10 of absolute noise: relative errors are taken against at least
// this, so gradients near zero are held to an absolute ~1e-8.
constexpr double kFdFloor = 0.1;

double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }

std::vector<int32_t> ints(Context& ctx, const Tensor& t) { return ops::to_vector<int32_t>(ctx, t); }

// The router's outputs for logits (N, E), all f64 (or f32) CPU tensors.
struct Routed {
  Tensor indices, weights, scores;
};
Routed route(Context& ctx, const Tensor& logits, const ops::RouterOptions& o,
             const Tensor& bias = Tensor()) {
  const int64_t N = logits.size(0), E = logits.size(1);
  const DType s = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Routed r{ops::empty(ctx, Shape{N, o.top_k}, DType::i32), ops::empty(ctx, Shape{N, o.top_k}, s),
           ops::empty(ctx, Shape{N, E}, s)};
  ops::moe_router_forward(ctx, r.indices, r.weights, r.scores, logits, o, bias);
  return r;
}

// The sort's outputs for indices (N, k) over E experts.
struct Sorted {
  Tensor counts, source, dest;
};
Sorted sort_pairs(Context& ctx, const Tensor& indices, int64_t E) {
  const int64_t N = indices.size(0), k = indices.size(1);
  Sorted s{ops::empty(ctx, Shape{E}, DType::i32), ops::empty(ctx, Shape{N * k}, DType::i32),
           ops::empty(ctx, Shape{N, k}, DType::i32)};
  ops::moe_sort_by_expert(ctx, s.counts, s.source, s.dest, indices);
  return s;
}

std::vector<int64_t> host_counts(Context& ctx, const Tensor& counts) {
  std::vector<int64_t> c;
  for (int32_t v : ints(ctx, counts)) c.push_back(v);
  return c;
}

}  // namespace

TEST_CASE("moe router: softmax top-k by hand, ties to the lower expert", "[kernels][nn][moe]") {
  Context ctx;
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(dtype_name(dt));
    // Row 0 ties experts 1 and 2 at the top; row 1 ties all four; row 2 is plain.
    const std::vector<double> l = {1, 3, 3, 0, 0, 0, 0, 0, 5, -1, 2, 7};
    const Tensor logits = ops::from_vector(ctx, l, Shape{3, 4}, dt);
    ops::RouterOptions o;
    o.top_k = 2;
    Routed r = route(ctx, logits, o);
    CHECK(ints(ctx, r.indices) == std::vector<int32_t>{1, 2, 0, 1, 3, 0});
    // Scores: the row softmax.
    std::vector<double> want(12);
    for (int n = 0; n < 3; ++n) {
      double z = 0;
      for (int e = 0; e < 4; ++e) z += std::exp(l[size_t(n * 4 + e)]);
      for (int e = 0; e < 4; ++e) want[size_t(n * 4 + e)] = std::exp(l[size_t(n * 4 + e)]) / z;
    }
    CHECK(max_rel_diff(values(ctx, r.scores), want, 1e-30) < 1e-6);
    // Normalized: the two chosen scores over their sum.
    const double w2 = std::exp(7.0) / (std::exp(7.0) + std::exp(5.0));
    CHECK(max_rel_diff(values(ctx, r.weights), {0.5, 0.5, 0.5, 0.5, w2, 1 - w2}, 1e-30) < 1e-6);
    // Unnormalized (OLMoE): the chosen scores themselves.
    o.normalize = false;
    r = route(ctx, logits, o);
    CHECK(max_rel_diff(values(ctx, r.weights), {want[1], want[2], 0.25, 0.25, want[11], want[8]},
                       1e-30) < 1e-6);
  }
}

TEST_CASE("moe router: sigmoid scores; the bias changes the choice, not the weights",
          "[kernels][nn][moe]") {
  Context ctx;
  const std::vector<double> l = {2, 1, 0, -1};
  const Tensor logits = ops::from_vector(ctx, l, Shape{1, 4}, DType::f64);
  ops::RouterOptions o;
  o.score = ops::RouterScore::Sigmoid;
  o.top_k = 2;
  o.normalize = false;
  Routed plain = route(ctx, logits, o);
  CHECK(ints(ctx, plain.indices) == std::vector<int32_t>{0, 1});
  CHECK(max_rel_diff(values(ctx, plain.scores), {sig(2), sig(1), sig(0), sig(-1)}, 1e-30) < 1e-14);
  CHECK(max_rel_diff(values(ctx, plain.weights), {sig(2), sig(1)}, 1e-30) < 1e-14);
  // Expert 3's key sig(-1) + 1 = 1.27 now leads; its weight is still its unbiased score.
  const Tensor bias = ops::from_vector(ctx, {0, 0, 0, 1}, Shape{4}, DType::f32);
  Routed biased = route(ctx, logits, o, bias);
  CHECK(ints(ctx, biased.indices) == std::vector<int32_t>{3, 0});
  CHECK(max_rel_diff(values(ctx, biased.weights), {sig(-1), sig(2)}, 1e-30) < 1e-14);
  CHECK(values(ctx, biased.scores) == values(ctx, plain.scores));
  o.normalize = true;  // DeepSeek-V3: the chosen sigmoids over their sum
  biased = route(ctx, logits, o, bias);
  const double z = sig(-1) + sig(2);
  CHECK(max_rel_diff(values(ctx, biased.weights), {sig(-1) / z, sig(2) / z}, 1e-30) < 1e-14);
  // A bias that makes keys equal: the lower expert wins the tie.
  const Tensor zeros = ops::zeros(ctx, Shape{1, 3}, DType::f64);
  const Tensor tie = ops::from_vector(ctx, {0, 0.25, 0.25}, Shape{3}, DType::f32);
  o.top_k = 1;
  CHECK(ints(ctx, route(ctx, zeros, o, tie).indices) == std::vector<int32_t>{1});
  // A negative bias pushes an expert out of the choice.
  const Tensor low = ops::from_vector(ctx, {-1, 0, 0, 0}, Shape{4}, DType::f32);
  CHECK(ints(ctx, route(ctx, logits, o, low).indices) == std::vector<int32_t>{1});
}

TEST_CASE("moe router: k = 1 and k = E", "[kernels][nn][moe]") {
  Context ctx;
  const Tensor logits = ops::from_vector(ctx, {0.5, -2, 3, 1, 1, 0, 0, 2}, Shape{2, 4}, DType::f64);
  ops::RouterOptions o;
  o.top_k = 1;
  Routed r = route(ctx, logits, o);
  CHECK(ints(ctx, r.indices) == std::vector<int32_t>{2, 3});
  CHECK(max_rel_diff(values(ctx, r.weights), {1, 1}, 1e-30) < 1e-15);  // normalized alone
  // k = E: every expert in score order; normalized weights are the softmax itself.
  o.top_k = 4;
  r = route(ctx, logits, o);
  CHECK(ints(ctx, r.indices) == std::vector<int32_t>{2, 3, 0, 1, 3, 0, 1, 2});
  const std::vector<double> s = values(ctx, r.scores), w = values(ctx, r.weights);
  const std::vector<int32_t> idx = ints(ctx, r.indices);
  for (size_t i = 0; i < idx.size(); ++i)
    CHECK(std::fabs(w[i] - s[(i / 4) * 4 + size_t(idx[i])]) < 1e-15);
  o.top_k = 5;
  CHECK_THROWS_AS(route(ctx, logits, o), ValueError);
  o.top_k = 0;
  CHECK_THROWS_AS(route(ctx, logits, o), ValueError);
}

TEST_CASE("moe router: argument checks name the problem", "[kernels][nn][moe]") {
  Context ctx;
  const Tensor logits = random_tensor(ctx, Shape{3, 4}, DType::f32, 1);
  ops::RouterOptions o;
  const Tensor idx = ops::empty(ctx, Shape{3, 2}, DType::i32);
  const Tensor scores = ops::empty(ctx, Shape{3, 4}, DType::f32);
  // f64 weights beside f32 logits, and a bias of the wrong length.
  CHECK_THROWS_AS(ops::moe_router_forward(ctx, idx, ops::empty(ctx, Shape{3, 2}, DType::f64),
                                          scores, logits, o),
                  DTypeError);
  CHECK_THROWS_AS(ops::moe_router_forward(ctx, idx, ops::empty(ctx, Shape{3, 2}, DType::f32),
                                          scores, logits, o, ops::zeros(ctx, Shape{3}, DType::f32)),
                  ShapeError);
  // An out-of-range expert index is refused by the backward.
  const Tensor bad = ops::from_host<int32_t>(ctx, {0, 1, 2, 4, 1, 0}, Shape{3, 2});
  const Tensor dlogits = ops::empty(ctx, Shape{3, 4}, DType::f32);
  const Tensor dweights = ops::zeros(ctx, Shape{3, 2}, DType::f32);
  CHECK_THROWS_AS(ops::moe_router_backward(ctx, dlogits, dweights, scores, bad, o), IndexError);
}

TEST_CASE("moe router backward matches finite differences", "[kernels][nn][moe]") {
  Context ctx;
  const int64_t N = 5, E = 6;
  for (auto score : {ops::RouterScore::Softmax, ops::RouterScore::Sigmoid}) {
    for (bool normalize : {true, false}) {
      for (int64_t k : {int64_t(1), int64_t(2), E}) {
        for (bool with_bias : {false, true}) {
          INFO((score == ops::RouterScore::Softmax ? "softmax" : "sigmoid")
               << " normalize " << normalize << " k " << k << " bias " << with_bias);
          ops::RouterOptions o{score, k, normalize};
          const Tensor logits = random_tensor(ctx, Shape{N, E}, DType::f64, 7, -2, 2);
          const Tensor bias =
              with_bias ? random_tensor(ctx, Shape{E}, DType::f32, 8, -0.3, 0.3) : Tensor();
          // The loss sum(gw * weights) + sum(gs * scores): gradients reach both outputs.
          const Tensor gw = random_tensor(ctx, Shape{N, k}, DType::f64, 9);
          const Tensor gs = random_tensor(ctx, Shape{N, E}, DType::f64, 10);
          const Routed r = route(ctx, logits, o, bias);
          const Tensor dlogits = ops::empty(ctx, Shape{N, E}, DType::f64);
          ops::moe_router_backward(ctx, dlogits, gw, r.scores, r.indices, o, gs);
          const std::vector<int32_t> chosen = ints(ctx, r.indices);
          auto loss = [&] {
            const Routed p = route(ctx, logits, o, bias);
            REQUIRE(ints(ctx, p.indices) == chosen);  // the choice must not move
            return weighted_sum(ctx, p.weights, gw) + weighted_sum(ctx, p.scores, gs);
          };
          const std::vector<double> numeric = numeric_grad(logits, loss);
          CHECK(max_rel_diff(values(ctx, dlogits), numeric, kFdFloor) < kFdTol);
          // Without the direct score gradient: the weights' part alone.
          ops::moe_router_backward(ctx, dlogits, gw, r.scores, r.indices, o);
          auto weights_loss = [&] {
            return weighted_sum(ctx, route(ctx, logits, o, bias).weights, gw);
          };
          CHECK(max_rel_diff(values(ctx, dlogits), numeric_grad(logits, weights_loss), kFdFloor) <
                kFdTol);
        }
      }
    }
  }
}

TEST_CASE("moe sort: counts and a stable grouping by expert, by hand", "[kernels][nn][moe]") {
  Context ctx;
  // Pairs p = 2 n + j: expert 0 gets p = 1, 2, 5; expert 2 gets p = 0, 3; expert 3 gets p = 4.
  const Tensor idx = ops::from_host<int32_t>(ctx, {2, 0, 0, 2, 3, 0}, Shape{3, 2});
  const Sorted s = sort_pairs(ctx, idx, 5);
  CHECK(ints(ctx, s.counts) == std::vector<int32_t>{3, 0, 2, 1, 0});
  CHECK(ints(ctx, s.source) == std::vector<int32_t>{0, 1, 2, 0, 1, 2});
  CHECK(ints(ctx, s.dest) == std::vector<int32_t>{3, 0, 1, 4, 5, 2});
  // A larger random case: source[dest[n, j]] == n, rows grouped by expert in (n, j) order.
  const int64_t N = 50, k = 3, E = 7;
  std::vector<int32_t> ids;
  const std::vector<double> u = testing::uniform_values(N * k, 3, 0, E);
  for (double v : u) ids.push_back(int32_t(v));
  const Sorted r = sort_pairs(ctx, ops::from_host(ctx, ids, Shape{N, k}), E);
  const std::vector<int32_t> src = ints(ctx, r.source), dst = ints(ctx, r.dest);
  std::vector<int32_t> expert_of_row(size_t(N * k));
  for (int64_t p = 0; p < N * k; ++p) {
    CHECK(src[size_t(dst[size_t(p)])] == int32_t(p / k));
    expert_of_row[size_t(dst[size_t(p)])] = ids[size_t(p)];
  }
  for (size_t row = 1; row < expert_of_row.size(); ++row) {
    CHECK(expert_of_row[row - 1] <= expert_of_row[row]);
    if (expert_of_row[row - 1] == expert_of_row[row]) CHECK(src[row - 1] <= src[row]);
  }
  // Out-of-range indices are refused.
  const Tensor bad = ops::from_host<int32_t>(ctx, {0, 5}, Shape{1, 2});
  CHECK_THROWS_AS(sort_pairs(ctx, bad, 5), IndexError);
  const Tensor negative = ops::from_host<int32_t>(ctx, {0, -1}, Shape{1, 2});
  CHECK_THROWS_AS(sort_pairs(ctx, negative, 5), IndexError);
}

TEST_CASE("moe permute and its backward: gathers, and a gather-sum matching differences",
          "[kernels][nn][moe]") {
  Context ctx;
  const int64_t N = 4, k = 2, C = 3, E = 3;
  const Tensor idx = ops::from_host<int32_t>(ctx, {1, 0, 2, 1, 0, 2, 1, 2}, Shape{N, k});
  const Sorted s = sort_pairs(ctx, idx, E);
  const Tensor x = random_tensor(ctx, Shape{N, C}, DType::f64, 1);
  const Tensor xs = ops::empty(ctx, Shape{N * k, C}, DType::f64);
  ops::moe_permute(ctx, xs, x, s.source);
  const std::vector<double> xv = values(ctx, x), xsv = values(ctx, xs);
  const std::vector<int32_t> src = ints(ctx, s.source);
  for (int64_t r = 0; r < N * k; ++r)
    for (int64_t c = 0; c < C; ++c)
      CHECK(xsv[size_t(r * C + c)] == xv[size_t(src[size_t(r)] * C + c)]);

  const Tensor g = random_tensor(ctx, Shape{N * k, C}, DType::f64, 2);
  const Tensor dx = ops::empty(ctx, Shape{N, C}, DType::f64);
  ops::moe_permute_backward(ctx, dx, g, s.dest, false);
  auto loss = [&] {
    ops::moe_permute(ctx, xs, x, s.source);
    return weighted_sum(ctx, xs, g);
  };
  const std::vector<double> numeric = numeric_grad(x, loss);
  CHECK(max_rel_diff(values(ctx, dx), numeric, kFdFloor) < kFdTol);
  // Accumulating adds to what is there.
  const Tensor acc = ops::full(ctx, Shape{N, C}, DType::f64, 0.5);
  ops::moe_permute_backward(ctx, acc, g, s.dest, true);
  std::vector<double> want = numeric;
  for (double& v : want) v += 0.5;
  CHECK(max_rel_diff(values(ctx, acc), want, kFdFloor) < kFdTol);
  // Sorted rows that are not a whole number per token are refused.
  CHECK_THROWS_AS(ops::moe_permute(ctx, ops::empty(ctx, Shape{7, C}, DType::f64), x,
                                   ops::zeros(ctx, Shape{7}, DType::i32)),
                  ShapeError);
}

TEST_CASE("moe unpermute: the weighted combine and its gradients in y and the weights",
          "[kernels][nn][moe]") {
  Context ctx;
  for (int64_t k : {1, 2, 3}) {
    INFO("k " << k);
    const int64_t N = 4, C = 5, E = 3;
    std::vector<int32_t> ids;  // distinct experts per token
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < k; ++j) ids.push_back(int32_t((n + 2 * j) % E));
    const Sorted s = sort_pairs(ctx, ops::from_host(ctx, ids, Shape{N, k}), E);
    const Tensor y = random_tensor(ctx, Shape{N * k, C}, DType::f64, 3);
    const Tensor w = random_tensor(ctx, Shape{N, k}, DType::f64, 4, 0, 1);
    const Tensor out = ops::empty(ctx, Shape{N, C}, DType::f64);
    ops::moe_unpermute(ctx, out, y, w, s.dest);
    const std::vector<double> yv = values(ctx, y), wv = values(ctx, w), ov = values(ctx, out);
    const std::vector<int32_t> dst = ints(ctx, s.dest);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) {
        double want = 0;
        for (int64_t j = 0; j < k; ++j)
          want += wv[size_t(n * k + j)] * yv[size_t(dst[size_t(n * k + j)] * C + c)];
        CHECK(std::fabs(ov[size_t(n * C + c)] - want) < 1e-14);
      }
    const Tensor g = random_tensor(ctx, Shape{N, C}, DType::f64, 5);
    const Tensor dy = ops::empty(ctx, Shape{N * k, C}, DType::f64);
    const Tensor dw = ops::empty(ctx, Shape{N, k}, DType::f64);
    ops::moe_unpermute_backward(ctx, dy, dw, g, y, w, s.dest);
    auto loss = [&] {
      ops::moe_unpermute(ctx, out, y, w, s.dest);
      return weighted_sum(ctx, out, g);
    };
    CHECK(max_rel_diff(values(ctx, dy), numeric_grad(y, loss), kFdFloor) < kFdTol);
    CHECK(max_rel_diff(values(ctx, dw), numeric_grad(w, loss), kFdFloor) < kFdTol);
  }
}

TEST_CASE("moe grouped matmul: per-expert products, zero-row experts, finite differences",
          "[kernels][nn][moe]") {
  Context ctx;
  const int64_t K = 5, F = 4, E = 4;
  // Experts 0 and 3 (first and last) and 2 get no rows.
  for (const std::vector<int64_t>& counts :
       {std::vector<int64_t>{0, 3, 0, 0}, std::vector<int64_t>{2, 0, 3, 1},
        std::vector<int64_t>{0, 1, 4, 0}}) {
    int64_t R = 0;
    for (int64_t c : counts) R += c;
    INFO("rows " << R);
    const Tensor x = random_tensor(ctx, Shape{R, K}, DType::f64, 1);
    const Tensor w = random_tensor(ctx, Shape{E, F, K}, DType::f64, 2);
    const Tensor y = ops::empty(ctx, Shape{R, F}, DType::f64);
    ops::moe_grouped_matmul(ctx, y, x, w, counts);
    const std::vector<double> xv = values(ctx, x), wv = values(ctx, w), yv = values(ctx, y);
    int64_t row = 0;
    for (int64_t e = 0; e < E; ++e)
      for (int64_t i = 0; i < counts[size_t(e)]; ++i, ++row)
        for (int64_t f = 0; f < F; ++f) {
          double want = 0;
          for (int64_t q = 0; q < K; ++q)
            want += xv[size_t(row * K + q)] * wv[size_t((e * F + f) * K + q)];
          CHECK(std::fabs(yv[size_t(row * F + f)] - want) < 1e-13);
        }

    const Tensor g = random_tensor(ctx, Shape{R, F}, DType::f64, 3);
    const Tensor dx = ops::empty(ctx, Shape{R, K}, DType::f64);
    const Tensor dw = ops::full(ctx, Shape{E, F, K}, DType::f64, 7.0);  // overwritten
    ops::moe_grouped_matmul_backward(ctx, dx, dw, g, x, w, counts, false);
    auto loss = [&] {
      ops::moe_grouped_matmul(ctx, y, x, w, counts);
      return weighted_sum(ctx, y, g);
    };
    const std::vector<double> dw_numeric = numeric_grad(w, loss);
    CHECK(max_rel_diff(values(ctx, dx), numeric_grad(x, loss), kFdFloor) < kFdTol);
    CHECK(max_rel_diff(values(ctx, dw), dw_numeric, kFdFloor) < kFdTol);
    // Accumulating: experts with rows gain their gradient, the others stay at 1.
    const Tensor acc = ops::full(ctx, Shape{E, F, K}, DType::f64, 1.0);
    ops::moe_grouped_matmul_backward(ctx, Tensor(), acc, g, x, w, counts, true);
    std::vector<double> want = dw_numeric;
    for (double& v : want) v += 1.0;
    CHECK(max_rel_diff(values(ctx, acc), want, kFdFloor) < kFdTol);
    for (int64_t e = 0; e < E; ++e)
      if (counts[size_t(e)] == 0)
        CHECK(values(ctx, acc.select(0, e)) == std::vector<double>(size_t(F * K), 1.0));
  }
  // f32 inputs with f32 and f64 gradients; counts that do not cover x are refused.
  const Tensor x = random_tensor(ctx, Shape{3, K}, DType::f32, 4);
  const Tensor w = random_tensor(ctx, Shape{E, F, K}, DType::f32, 5);
  const Tensor y = ops::empty(ctx, Shape{3, F}, DType::f32);
  CHECK_THROWS_AS(ops::moe_grouped_matmul(ctx, y, x, w, {1, 1, 0, 0}), ShapeError);
  CHECK_THROWS_AS(ops::moe_grouped_matmul(ctx, y, x, w, {1, 1, 1}), ShapeError);
  CHECK_THROWS_AS(ops::moe_grouped_matmul(ctx, y, x, w, {4, -1, 0, 0}), ValueError);
  ops::moe_grouped_matmul(ctx, y, x, w, {1, 0, 2, 0});
  const Tensor g = random_tensor(ctx, Shape{3, F}, DType::f32, 6);
  const Tensor dw32 = ops::empty(ctx, Shape{E, F, K}, DType::f32);
  const Tensor dw64 = ops::empty(ctx, Shape{E, F, K}, DType::f64);
  ops::moe_grouped_matmul_backward(ctx, Tensor(), dw32, g, x, w, {1, 0, 2, 0}, false);
  ops::moe_grouped_matmul_backward(ctx, Tensor(), dw64, g, x, w, {1, 0, 2, 0}, false);
  CHECK(max_rel_diff(values(ctx, dw32), values(ctx, dw64), 1e-3) < 1e-6);
  CHECK(values(ctx, dw64.select(0, 1)) == std::vector<double>(size_t(F * K), 0.0));
}

TEST_CASE("moe layer from the kernels: routing, experts and combine match differences",
          "[kernels][nn][moe]") {
  // out = sum_j w[n, j] * (x[n] @ W_e^T) over the chosen experts e = i[n, j], with the router
  // on separate logits: every kernel's backward chained as the layer will chain them.
  Context ctx;
  const int64_t N = 6, C = 4, F = 3, E = 4, k = 2;
  const Tensor x = random_tensor(ctx, Shape{N, C}, DType::f64, 1);
  const Tensor logits = random_tensor(ctx, Shape{N, E}, DType::f64, 2, -2, 2);
  const Tensor W = random_tensor(ctx, Shape{E, F, C}, DType::f64, 3);
  const Tensor g = random_tensor(ctx, Shape{N, F}, DType::f64, 4);
  const ops::RouterOptions o{ops::RouterScore::Softmax, k, true};
  struct Forward {
    Routed r;
    Sorted s;
    std::vector<int64_t> counts;
    Tensor xs, ys, out;
  };
  auto forward = [&] {
    Forward f{route(ctx, logits, o), {}, {}, {}, {}, {}};
    f.s = sort_pairs(ctx, f.r.indices, E);
    f.counts = host_counts(ctx, f.s.counts);
    f.xs = ops::empty(ctx, Shape{N * k, C}, DType::f64);
    ops::moe_permute(ctx, f.xs, x, f.s.source);
    f.ys = ops::empty(ctx, Shape{N * k, F}, DType::f64);
    ops::moe_grouped_matmul(ctx, f.ys, f.xs, W, f.counts);
    f.out = ops::empty(ctx, Shape{N, F}, DType::f64);
    ops::moe_unpermute(ctx, f.out, f.ys, f.r.weights, f.s.dest);
    return f;
  };
  const Forward f = forward();
  const Tensor dys = ops::empty(ctx, Shape{N * k, F}, DType::f64);
  const Tensor dweights = ops::empty(ctx, Shape{N, k}, DType::f64);
  ops::moe_unpermute_backward(ctx, dys, dweights, g, f.ys, f.r.weights, f.s.dest);
  const Tensor dxs = ops::empty(ctx, Shape{N * k, C}, DType::f64);
  const Tensor dW = ops::empty(ctx, Shape{E, F, C}, DType::f64);
  ops::moe_grouped_matmul_backward(ctx, dxs, dW, dys, f.xs, W, f.counts, false);
  const Tensor dx = ops::empty(ctx, Shape{N, C}, DType::f64);
  ops::moe_permute_backward(ctx, dx, dxs, f.s.dest, false);
  const Tensor dlogits = ops::empty(ctx, Shape{N, E}, DType::f64);
  ops::moe_router_backward(ctx, dlogits, dweights, f.r.scores, f.r.indices, o);

  auto loss = [&] { return weighted_sum(ctx, forward().out, g); };
  CHECK(max_rel_diff(values(ctx, dx), numeric_grad(x, loss), kFdFloor) < kFdTol);
  CHECK(max_rel_diff(values(ctx, dW), numeric_grad(W, loss), kFdFloor) < kFdTol);
  CHECK(max_rel_diff(values(ctx, dlogits), numeric_grad(logits, loss), kFdFloor) < kFdTol);
}
