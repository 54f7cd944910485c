// nn::classifier_loss, the head and loss fused and chunked over rows: its loss and gradients
// against the unchunked path (linear, then cross_entropy) for many chunk sizes, tied and
// accumulated weight gradients, evaluation without a tape, finite differences in f64, bad
// arguments, and the CUDA op against the CPU.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "runtime/nn/functional.h"
#include "tests/kernels/nn_test_util.h"
#include "tests/nn/gradcheck.h"
#include "tests/test_support.h"

namespace fsdp::testing {
namespace {

using autograd::Graph;
using nn::Parameter;

// Targets in [0, vocab) with every `ignore_every`-th one -1 (ignored; 0 = none).
std::vector<int32_t> target_ids(int64_t n, int64_t vocab, uint32_t seed, int64_t ignore_every) {
  const std::vector<double> u = uniform_values(n, seed, 0, 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    t[size_t(i)] = ignore_every > 0 && i % ignore_every == 1
                       ? -1
                       : int32_t(u[size_t(i)] * double(vocab - 1));
  t[0] = int32_t(vocab - 1);  // the last real class
  return t;
}

struct Result {
  double loss = 0;
  std::vector<double> dx, dw;
};

using LossFn = std::function<Tensor(Graph&, const Tensor& x, Parameter& w)>;

// Runs `fn` on a leaf copy of x, then backward with d(loss) = dloss; returns the loss and
// the gradients of x and of w (w.grad starts from `w_grad0`, undefined = none).
Result run(Context& ctx, const Tensor& x, Parameter& w, const Tensor& w_grad0, double dloss,
           const LossFn& fn) {
  w.grad = w_grad0.defined() ? ops::clone(ctx, w_grad0) : Tensor();
  Graph g(ctx);
  const Tensor xl = Graph::leaf(ops::clone(ctx, x));
  const Tensor loss = fn(g, xl, w);
  Result r;
  r.loss = ops::item(ctx, loss);
  g.backward(loss, dloss);
  CHECK(g.num_nodes() == 0);
  r.dx = values(ctx, Graph::grad(xl));
  r.dw = values(ctx, w.grad);
  return r;
}

LossFn unchunked(const Tensor& targets, int64_t vocab, int64_t n_valid) {
  return [=](Graph& g, const Tensor& x, Parameter& w) {
    return nn::cross_entropy(g, nn::linear(g, x, w), targets, vocab, n_valid);
  };
}

LossFn chunked(const Tensor& targets, int64_t vocab, int64_t n_valid, int64_t chunk) {
  return [=](Graph& g, const Tensor& x, Parameter& w) {
    return nn::classifier_loss(g, x, w, targets, vocab, n_valid, chunk);
  };
}

std::unique_ptr<Parameter> head(Context& ctx, int64_t vp, int64_t c, DType dt, uint32_t seed) {
  auto p = std::make_unique<Parameter>("head", Shape{vp, c}, nn::InitRule::zeros(), true);
  p->data = random_tensor(ctx, Shape{vp, c}, dt, seed, -0.5, 0.5);
  return p;
}

TEST_CASE("classifier_loss equals linear + cross_entropy for every chunk size", "[nn]") {
  Context ctx;
  // N = 2 x 11 = 22 rows; chunks that divide it, that do not, of one row, and larger than N.
  const int64_t B = 2, T = 11, N = B * T, C = 12, V = 37, Vp = 40;
  const Tensor targets = ops::from_host<int32_t>(ctx, target_ids(N, V, 5, 4), Shape{B, T});
  const int64_t n_valid = N - 6;  // rows 1, 5, 9, 13, 17, 21 are ignored
  for (DType dt : {DType::f32, DType::f64}) {
    const Tensor x = random_tensor(ctx, Shape{B, T, C}, dt, 6, -2, 2);
    auto w = head(ctx, Vp, C, dt, 7);
    // A gradient already in w.grad (another micro-batch's): both paths must add to it.
    const Tensor grad0 = random_tensor(ctx, Shape{Vp, C}, w->grad_dtype(), 8);
    const double dloss = 0.625;  // not 1: backward must scale what the forward computed
    const Result want = run(ctx, x, *w, grad0, dloss, unchunked(targets, V, n_valid));
    REQUIRE(max_abs(want.dx) > 0);
    for (int64_t chunk : {int64_t(0), int64_t(1), int64_t(5), int64_t(11), int64_t(22),
                          int64_t(64)}) {
      INFO(dtype_name(dt) << " chunk_rows " << chunk);
      const Result got = run(ctx, x, *w, grad0, dloss, chunked(targets, V, n_valid, chunk));
      // The same f32/f64 arithmetic in another order (per-chunk matmuls, dW summed over
      // chunks): agreement to a few roundings.
      const double tol = dt == DType::f32 ? 2e-6 : 1e-13;
      CHECK(got.loss == Approx(want.loss).epsilon(tol));
      CHECK(max_rel_diff(got.dx, want.dx, max_abs(want.dx)) < tol);
      CHECK(max_rel_diff(got.dw, want.dw, max_abs(want.dw)) < tol);
    }
    // n_valid counted from the targets gives the same loss.
    const Result counted = run(ctx, x, *w, grad0, dloss, chunked(targets, V, -1, 5));
    CHECK(counted.loss == Approx(want.loss).epsilon(1e-6));
  }
}

TEST_CASE("classifier_loss: a tied head sums the embedding's and the classifier's gradients",
          "[nn]") {
  Context ctx;
  const int64_t B = 3, T = 5, N = B * T, C = 8, V = 20, Vp = 24;
  const std::vector<int32_t> ids = target_ids(N, V, 11, 0);  // token ids: none ignored
  const Tensor idx = ops::from_host<int32_t>(ctx, ids, Shape{B, T});
  const Tensor targets = ops::from_host<int32_t>(ctx, target_ids(N, V, 12, 3), Shape{B, T});
  auto wte = head(ctx, Vp, C, DType::f32, 13);
  // embedding -> the head, tied to the same table -> loss.
  auto tied = [&](const LossFn& loss) {
    wte->grad = Tensor();
    Graph g(ctx);
    const Tensor h = nn::embedding(g, idx, *wte);  // (B, T, C)
    const Tensor l = loss(g, h, *wte);
    const double v = ops::item(ctx, l);
    g.backward(l);
    return std::make_pair(v, values(ctx, wte->grad));
  };
  const auto want = tied(unchunked(targets, V, -1));
  const auto got = tied(chunked(targets, V, -1, 4));
  CHECK(got.first == Approx(want.first).epsilon(1e-6));
  CHECK(max_rel_diff(got.second, want.second, max_abs(want.second)) < 2e-6);

  // By hand: the classifier's dW plus the embedding's scatter of dx into the rows of idx.
  Graph g0(ctx);
  const Tensor h = nn::embedding(g0, idx, *wte);
  g0.clear();
  const Result parts = run(ctx, ops::clone(ctx, h), *wte, Tensor(), 1.0,
                           chunked(targets, V, -1, 4));
  std::vector<double> sum = parts.dw;
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < C; ++c)
      sum[size_t(ids[size_t(r)] * C + c)] += parts.dx[size_t(r * C + c)];
  CHECK(max_rel_diff(got.second, sum, max_abs(sum)) < 2e-6);
  // Both parts matter here: neither alone is the tied gradient.
  CHECK(max_rel_diff(parts.dw, sum, max_abs(sum)) > 1e-3);
}

TEST_CASE("classifier_loss without a tape computes the loss only", "[nn]") {
  Context ctx;
  const int64_t N = 9, C = 6, V = 10, Vp = 16;
  const Tensor targets = ops::from_host<int32_t>(ctx, target_ids(N, V, 21, 4), Shape{N});
  const Tensor x = random_tensor(ctx, Shape{N, C}, DType::f32, 22, -2, 2);
  auto w = head(ctx, Vp, C, DType::f32, 23);
  double want = 0;
  {
    Graph g(ctx);
    autograd::NoGradGuard no_grad(g);
    want = ops::item(ctx, nn::cross_entropy(g, nn::linear(g, x, *w), targets, V));
  }
  for (int64_t chunk : {int64_t(0), int64_t(2), int64_t(4)}) {
    INFO("chunk_rows " << chunk);
    Graph g(ctx);
    autograd::NoGradGuard no_grad(g);
    const Tensor loss = nn::classifier_loss(g, x, *w, targets, V, -1, chunk);
    CHECK(ops::item(ctx, loss) == Approx(want).epsilon(1e-6));
    CHECK_FALSE(Graph::tracked(loss));
    CHECK(g.num_nodes() == 0);
    CHECK_FALSE(w->grad.defined());  // no gradient work happened
  }
  // With a tape: one node, and nothing reaches w.grad before backward.
  Graph g(ctx);
  const Tensor loss = nn::classifier_loss(g, Graph::leaf(x), *w, targets, V, -1, 4);
  CHECK(g.num_nodes() == 1);
  CHECK_FALSE(w->grad.defined());
  g.backward(loss);
  CHECK(w->grad.defined());
}

TEST_CASE("classifier_loss: every target ignored gives 0 and zero gradients", "[nn]") {
  Context ctx;
  const int64_t N = 6, C = 4, V = 8, Vp = 8;
  const std::vector<int32_t> none(static_cast<size_t>(N), -1);
  const Tensor targets = ops::from_host<int32_t>(ctx, none, Shape{N});
  const Tensor x = random_tensor(ctx, Shape{N, C}, DType::f32, 31);
  auto w = head(ctx, Vp, C, DType::f32, 32);
  const Result r = run(ctx, x, *w, Tensor(), 1.0, chunked(targets, V, -1, 4));
  CHECK(r.loss == 0.0);
  CHECK(max_abs(r.dx) == 0.0);
  CHECK(max_abs(r.dw) == 0.0);
}

TEST_CASE("finite differences: classifier_loss, chunked, padded and ignored", "[nn][gradcheck]") {
  Context ctx;
  const int64_t B = 2, T = 5, C = 6, V = 9, Vp = 12;
  const Tensor targets = ops::from_host<int32_t>(ctx, target_ids(B * T, V, 41, 3), Shape{B, T});
  for (int64_t chunk : {int64_t(3), int64_t(0)}) {
    Tensor x = ctx.empty(Shape{B, T, C}, DType::f64);
    fill_random(ctx, x, 42);
    auto w = std::make_unique<Parameter>("head", Shape{Vp, C}, nn::InitRule::zeros(), true);
    w->data = ctx.empty(Shape{Vp, C}, DType::f64);
    fill_random(ctx, w->data, 43, 0.5);
    Parameter* wp = w.get();
    check_gradients(ctx, {str_cat("classifier_loss chunk_rows ", chunk), {x}, {wp},
                          [=](Graph& g, const std::vector<Tensor>& in) {
                            return nn::classifier_loss(g, in[0], *wp, targets, V, -1, chunk);
                          }});
  }
}

TEST_CASE("classifier_loss rejects bad arguments by name", "[nn]") {
  Context ctx;
  const int64_t N = 4, C = 3, V = 5, Vp = 8;
  const Tensor targets = ops::from_host<int32_t>(ctx, {0, 1, 2, 3}, Shape{N});
  const Tensor x = random_tensor(ctx, Shape{N, C}, DType::f32, 51);
  auto w = head(ctx, Vp, C, DType::f32, 52);
  Graph g(ctx);
  auto message = [&](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(message([&] { nn::classifier_loss(g, x, *w, targets, V, -1, -1); }),
             Catch::Contains("chunk_rows"));
  CHECK_THAT(message([&] { nn::classifier_loss(g, x, *w, targets, Vp + 1, -1, 2); }),
             Catch::Contains("vocab_size"));
  const Tensor x_wide = random_tensor(ctx, Shape{N, C + 1}, DType::f32, 53);
  CHECK_THAT(message([&] { nn::classifier_loss(g, x_wide, *w, targets, V, -1, 2); }),
             Catch::Contains("input x"));
  const Tensor short_targets = ops::from_host<int32_t>(ctx, {0, 1, 2}, Shape{3});
  CHECK_THAT(message([&] { nn::classifier_loss(g, x, *w, short_targets, V, -1, 2); }),
             Catch::Contains("targets"));
  CHECK_THAT(message([&] { nn::classifier_loss(g, x, *w, targets, V, N + 1, 2); }),
             Catch::Contains("n_valid"));
  const Tensor bad = ops::from_host<int32_t>(ctx, {0, 1, 5, 3}, Shape{N});  // 5 = V
  CHECK_THROWS_AS(nn::classifier_loss(g, x, *w, bad, V, -1, 2), IndexError);
}

// The CUDA op (bf16 and f32, a chunk size that does not divide N, GPT-2's padded
// vocabulary) against the CPU's unchunked path in f32 on the same (rounded) values.
TEST_CASE("CUDA classifier_loss matches the CPU's linear + cross_entropy", "[nn][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  const int64_t N = 700, C = 128, V = 50257, Vp = 50304;
  const Tensor tgt_cpu = ops::from_host<int32_t>(cpu, target_ids(N, V, 61, 7), Shape{N});
  const Tensor tgt_gpu = ops::to_device(gpu, tgt_cpu, gpu.device());
  for (DType dt : {DType::bf16, DType::f32}) {
    INFO(dtype_name(dt));
    const Tensor x_host = random_tensor(cpu, Shape{N, C}, dt, 62, -1, 1);
    const Tensor w_host = random_tensor(cpu, Shape{Vp, C}, dt, 63, -0.2, 0.2);
    Parameter w_cpu("head", Shape{Vp, C}, nn::InitRule::zeros(), true);
    Parameter w_gpu("head", Shape{Vp, C}, nn::InitRule::zeros(), true);
    w_cpu.data = ops::cast(cpu, w_host, DType::f32);
    w_gpu.data = ops::to_device(gpu, w_host, gpu.device());
    const double dloss = 0.5;
    const Result want = run(cpu, ops::cast(cpu, x_host, DType::f32), w_cpu, Tensor(), dloss,
                            unchunked(tgt_cpu, V, -1));
    const Result got = run(gpu, ops::to_device(gpu, x_host, gpu.device()), w_gpu, Tensor(), dloss,
                           chunked(tgt_gpu, V, -1, 256));
    // bf16: the logits and their gradients are rounded to bf16 (2^-9) before the matmuls that
    // give dx and dW; f32: f32 sums in another order, and the fast exponential.
    const bool bf16 = dt == DType::bf16;
    CHECK(got.loss == Approx(want.loss).epsilon(bf16 ? 2e-3 : 1e-5));
    CHECK(max_rel_diff(got.dx, want.dx, max_abs(want.dx)) < (bf16 ? 3e-2 : 1e-4));
    CHECK(max_rel_diff(got.dw, want.dw, max_abs(want.dw)) < (bf16 ? 3e-2 : 1e-4));
    CHECK(w_gpu.grad.dtype() == DType::f32);
  }
}

}  // namespace
}  // namespace fsdp::testing
