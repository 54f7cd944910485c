// CPU embeddings, norms, activations and rotary embeddings against direct formulas, with
// backward passes checked against f64 central differences.
#include <cmath>

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

std::vector<double> scaled(std::vector<double> v, double s) {
  for (double& x : v) x *= s;
  return v;
}

}  // namespace

TEST_CASE("embedding forward gathers token rows and adds positions", "[kernels][nn]") {
  Context ctx;
  const int64_t B = 2, T = 3, C = 4, V = 5;
  Tensor wte = random_tensor(ctx, Shape{V, C}, DType::f32, 1);
  Tensor wpe = random_tensor(ctx, Shape{T + 2, C}, DType::f32, 2);  // longer than T
  Tensor idx = ops::from_host<int32_t>(ctx, {4, 0, 4, 1, 2, 3}, Shape{B, T});
  Tensor out = ops::empty(ctx, Shape{B, T, C}, DType::f32);
  ops::embedding_forward(ctx, out, idx, wte, wpe);
  const auto e = values(ctx, wte), p = values(ctx, wpe), o = values(ctx, out);
  const std::vector<int> ids = {4, 0, 4, 1, 2, 3};
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t c = 0; c < C; ++c)
      CHECK(o[size_t(bt * C + c)] ==
            double(float(e[size_t(ids[size_t(bt)] * C + c)] + p[size_t((bt % T) * C + c)])));
  // Without positions: a plain gather.
  ops::embedding_forward(ctx, out, idx, wte);
  CHECK(values(ctx, out)[size_t(2 * C + 1)] == e[size_t(4 * C + 1)]);
  Tensor bad = ops::from_host<int32_t>(ctx, {0, 5, 1, 1, 1, 1}, Shape{B, T});
  CHECK_THROWS_AS(ops::embedding_forward(ctx, out, bad, wte), IndexError);
}

TEST_CASE("embedding backward scatter-adds repeated tokens and sums positions over B",
          "[kernels][nn]") {
  Context ctx;
  const int64_t B = 2, T = 3, C = 4, V = 5;
  Tensor idx = ops::from_host<int32_t>(ctx, {4, 0, 4, 1, 4, 3}, Shape{B, T});
  Tensor dout = random_tensor(ctx, Shape{B, T, C}, DType::f32, 3);
  const auto g = values(ctx, dout);
  for (DType gd : {DType::f32, DType::f64}) {
    // Gradients always accumulate: start from ones.
    Tensor dwte = ops::full(ctx, Shape{V, C}, gd, 1.0);
    Tensor dwpe = ops::full(ctx, Shape{T + 1, C}, gd, 1.0);
    ops::embedding_backward(ctx, dwte, dwpe, dout, idx);
    std::vector<double> want_te(size_t(V * C), 1.0), want_pe(size_t((T + 1) * C), 1.0);
    const std::vector<int> ids = {4, 0, 4, 1, 4, 3};
    for (int64_t bt = 0; bt < B * T; ++bt)
      for (int64_t c = 0; c < C; ++c) {
        want_te[size_t(ids[size_t(bt)] * C + c)] += g[size_t(bt * C + c)];
        want_pe[size_t((bt % T) * C + c)] += g[size_t(bt * C + c)];
      }
    CHECK(max_rel_diff(values(ctx, dwte), want_te, 1.0) < 1e-6);
    CHECK(max_rel_diff(values(ctx, dwpe), want_pe, 1.0) < 1e-6);
    CHECK(values(ctx, dwte)[size_t(2 * C)] == 1.0);  // token 2 never occurs: untouched
  }
  // A bad id is refused before any gradient changes.
  Tensor bad = ops::from_host<int32_t>(ctx, {4, 0, 9, 1, 4, 3}, Shape{B, T});
  Tensor dwte = ops::full(ctx, Shape{V, C}, DType::f32, 1.0);
  CHECK_THROWS_AS(ops::embedding_backward(ctx, dwte, Tensor(), dout, bad), IndexError);
  CHECK(values(ctx, dwte) == std::vector<double>(size_t(V * C), 1.0));
}

TEST_CASE("a vocabulary shard's embedding: its rows, zeros for the others, summed to the whole",
          "[kernels][nn]") {
  Context ctx;
  const int64_t B = 2, T = 3, C = 4, V = 6;
  Tensor wte = random_tensor(ctx, Shape{V, C}, DType::f64, 1);
  Tensor idx = ops::from_host<int32_t>(ctx, {5, 0, 4, 1, 2, 3}, Shape{B, T});
  Tensor dout = random_tensor(ctx, Shape{B, T, C}, DType::f64, 3);
  Tensor whole = ops::empty(ctx, Shape{B, T, C}, DType::f64);
  ops::embedding_forward(ctx, whole, idx, wte);
  Tensor dwhole = ops::zeros(ctx, Shape{V, C}, DType::f64);
  ops::embedding_backward(ctx, dwhole, Tensor(), dout, idx);
  // Three shards of two rows: their outputs add up to the whole table's (each id is held
  // by one shard; the others give exact zeros), their gradients are its rows.
  std::vector<double> sum(size_t(B * T * C), 0.0);
  for (int64_t begin = 0; begin < V; begin += 2) {
    INFO("rows from " << begin);
    const ops::VocabShard shard{begin, V};
    Tensor out = ops::empty(ctx, Shape{B, T, C}, DType::f64);
    ops::embedding_forward(ctx, out, idx, wte.narrow(0, begin, 2), Tensor(), shard);
    const auto o = values(ctx, out);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += o[i];
    Tensor dpart = ops::zeros(ctx, Shape{2, C}, DType::f64);
    ops::embedding_backward(ctx, dpart, Tensor(), dout, idx, shard);
    CHECK(values(ctx, dpart) == values(ctx, dwhole.narrow(0, begin, 2)));
  }
  CHECK(sum == values(ctx, whole));
  // Ids are checked against the whole vocabulary, not the shard's rows.
  Tensor out = ops::empty(ctx, Shape{B, T, C}, DType::f64);
  Tensor bad = ops::from_host<int32_t>(ctx, {0, 6, 1, 1, 1, 1}, Shape{B, T});
  CHECK_THROWS_AS(ops::embedding_forward(ctx, out, bad, wte.narrow(0, 2, 2), Tensor(), {2, V}),
                  IndexError);
  CHECK_THROWS_AS(ops::embedding_forward(ctx, out, idx, wte.narrow(0, 2, 2), Tensor(), {5, V}),
                  ShapeError);
}

TEST_CASE("layernorm forward matches the formula; statistics saved", "[kernels][nn]") {
  Context ctx;
  const int64_t N = 5, C = 12;
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor x = random_tensor(ctx, Shape{N, C}, dt, 1, -2, 3);
    Tensor w = random_tensor(ctx, Shape{C}, dt, 2);
    Tensor b = random_tensor(ctx, Shape{C}, dt, 3);
    Tensor out = ops::empty(ctx, Shape{N, C}, dt);
    Tensor mean = ops::empty(ctx, Shape{N}, dt), rstd = ops::empty(ctx, Shape{N}, dt);
    ops::layernorm_forward(ctx, out, mean, rstd, x, w, b, 1e-5);
    const auto xv = values(ctx, x), wv = values(ctx, w), bv = values(ctx, b);
    std::vector<double> want(size_t(N * C), 0.0), want_mean(size_t(N), 0.0), want_rstd(size_t(N), 0.0);
    for (int64_t n = 0; n < N; ++n) {
      double m = 0, v = 0;
      for (int64_t c = 0; c < C; ++c) m += xv[size_t(n * C + c)] / C;
      for (int64_t c = 0; c < C; ++c) v += std::pow(xv[size_t(n * C + c)] - m, 2) / C;
      want_mean[size_t(n)] = m;
      want_rstd[size_t(n)] = 1 / std::sqrt(v + 1e-5);
      for (int64_t c = 0; c < C; ++c)
        want[size_t(n * C + c)] =
            (xv[size_t(n * C + c)] - m) * want_rstd[size_t(n)] * wv[size_t(c)] + bv[size_t(c)];
    }
    const double tol = dt == DType::f32 ? 1e-6 : 1e-13;
    CHECK(max_rel_diff(values(ctx, out), want, 1.0) < tol);
    CHECK(max_rel_diff(values(ctx, mean), want_mean, 1.0) < tol);
    CHECK(max_rel_diff(values(ctx, rstd), want_rstd, 1.0) < tol);
  }
  Context c2;
  Tensor x = ops::zeros(c2, Shape{2, 4}, DType::f32);
  CHECK_THROWS_AS(ops::layernorm_forward(c2, x, ops::zeros(c2, Shape{2}, DType::f32),
                                         ops::zeros(c2, Shape{2}, DType::f32), x,
                                         ops::zeros(c2, Shape{3}, DType::f32), Tensor(), 1e-5),
                  ShapeError);
  // The statistics of f32 data are f32, not f64.
  CHECK_THROWS_AS(ops::layernorm_forward(c2, x, ops::zeros(c2, Shape{2}, DType::f64),
                                         ops::zeros(c2, Shape{2}, DType::f64), x,
                                         ops::zeros(c2, Shape{4}, DType::f32), Tensor(), 1e-5),
                  DTypeError);
}

TEST_CASE("layernorm backward matches finite differences; accumulate flags", "[kernels][nn]") {
  Context ctx;
  const int64_t N = 4, C = 8;
  const DType dt = DType::f64;
  Tensor x = random_tensor(ctx, Shape{2, 2, C}, dt, 1, -2, 3);  // (B, T, C) rows
  Tensor w = random_tensor(ctx, Shape{C}, dt, 2);
  Tensor b = random_tensor(ctx, Shape{C}, dt, 3);
  Tensor dout = random_tensor(ctx, Shape{2, 2, C}, dt, 4);
  Tensor out = ops::empty(ctx, x.shape(), dt);
  Tensor mean = ops::empty(ctx, Shape{N}, dt), rstd = ops::empty(ctx, Shape{N}, dt);
  auto loss = [&] {
    ops::layernorm_forward(ctx, out, mean, rstd, x, w, b, 1e-5);
    return weighted_sum(ctx, out, dout);
  };
  const auto gx = numeric_grad(x, loss), gw = numeric_grad(w, loss), gb = numeric_grad(b, loss);
  loss();
  Tensor dx = ops::empty(ctx, x.shape(), dt);
  Tensor dw = ops::empty(ctx, Shape{C}, dt), db = ops::empty(ctx, Shape{C}, dt);
  ops::layernorm_backward(ctx, dx, dw, db, dout, x, w, mean, rstd, false, false);
  CHECK(max_rel_diff(values(ctx, dx), gx, 1.0) < kFdTol);
  CHECK(max_rel_diff(values(ctx, dw), gw, 1.0) < kFdTol);
  CHECK(max_rel_diff(values(ctx, db), gb, 1.0) < kFdTol);
  // accumulate_dx and accumulate add to what is there.
  ops::layernorm_backward(ctx, dx, dw, db, dout, x, w, mean, rstd, true, true);
  CHECK(max_rel_diff(values(ctx, dx), scaled(gx, 2), 1.0) < kFdTol);
  CHECK(max_rel_diff(values(ctx, dw), scaled(gw, 2), 1.0) < kFdTol);
  CHECK(max_rel_diff(values(ctx, db), scaled(gb, 2), 1.0) < kFdTol);
  // f32 compute with f64 parameter gradients, and no dx.
  Tensor xf = ops::cast(ctx, x, DType::f32), wf = ops::cast(ctx, w, DType::f32);
  Tensor bf = ops::cast(ctx, b, DType::f32), gf = ops::cast(ctx, dout, DType::f32);
  Tensor of = ops::empty(ctx, x.shape(), DType::f32);
  Tensor mf = ops::empty(ctx, Shape{N}, DType::f32), rf = ops::empty(ctx, Shape{N}, DType::f32);
  ops::layernorm_forward(ctx, of, mf, rf, xf, wf, bf, 1e-5);
  Tensor dw64 = ops::zeros(ctx, Shape{C}, DType::f64), db64 = ops::zeros(ctx, Shape{C}, DType::f64);
  ops::layernorm_backward(ctx, Tensor(), dw64, db64, gf, xf, wf, mf, rf, false, true);
  // Inputs rounded to f32 (2^-24 relative) move the gradients by ~1e-6 of their scale.
  CHECK(max_rel_diff(values(ctx, dw64), gw, 1.0) < 1e-5);
  CHECK(max_rel_diff(values(ctx, db64), gb, 1.0) < 1e-5);
}

TEST_CASE("rmsnorm forward and backward", "[kernels][nn]") {
  Context ctx;
  const int64_t N = 3, C = 10;
  const DType dt = DType::f64;
  Tensor x = random_tensor(ctx, Shape{N, C}, dt, 5, -2, 2);
  Tensor w = random_tensor(ctx, Shape{C}, dt, 6);
  Tensor dout = random_tensor(ctx, Shape{N, C}, dt, 7);
  Tensor out = ops::empty(ctx, x.shape(), dt), rstd = ops::empty(ctx, Shape{N}, dt);
  ops::rmsnorm_forward(ctx, out, rstd, x, w, 1e-6);
  const auto xv = values(ctx, x), wv = values(ctx, w);
  std::vector<double> want(size_t(N * C), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += xv[size_t(n * C + c)] * xv[size_t(n * C + c)];
    const double r = 1 / std::sqrt(ss / C + 1e-6);
    CHECK(values(ctx, rstd)[size_t(n)] == Approx(r).epsilon(1e-14));
    for (int64_t c = 0; c < C; ++c) want[size_t(n * C + c)] = xv[size_t(n * C + c)] * r * wv[size_t(c)];
  }
  CHECK(max_rel_diff(values(ctx, out), want, 1.0) < 1e-14);
  auto loss = [&] {
    ops::rmsnorm_forward(ctx, out, rstd, x, w, 1e-6);
    return weighted_sum(ctx, out, dout);
  };
  const auto gx = numeric_grad(x, loss), gw = numeric_grad(w, loss);
  loss();
  Tensor dx = ops::full(ctx, x.shape(), dt, 1.0), dw = ops::full(ctx, Shape{C}, dt, 1.0);
  ops::rmsnorm_backward(ctx, dx, dw, dout, x, w, rstd, true, true);  // adds to ones
  std::vector<double> gx1 = gx, gw1 = gw;
  for (double& v : gx1) v += 1;
  for (double& v : gw1) v += 1;
  CHECK(max_rel_diff(values(ctx, dx), gx1, 1.0) < kFdTol);
  CHECK(max_rel_diff(values(ctx, dw), gw1, 1.0) < kFdTol);
  ops::rmsnorm_backward(ctx, dx, dw, dout, x, w, rstd, false, false);  // overwrites
  CHECK(max_rel_diff(values(ctx, dx), gx, 1.0) < kFdTol);
  CHECK(max_rel_diff(values(ctx, dw), gw, 1.0) < kFdTol);
}

TEST_CASE("fused residual add + norm equals add then norm; dx_addend", "[kernels][nn]") {
  Context ctx;
  const int64_t N = 5, C = 12;
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor x = random_tensor(ctx, Shape{N, C}, dt, 11, -2, 2);
    Tensor r = random_tensor(ctx, Shape{N, C}, dt, 12, -2, 2);
    Tensor w = random_tensor(ctx, Shape{C}, dt, 13), b = random_tensor(ctx, Shape{C}, dt, 14);
    // Unfused: h = x + r, then the norms of h.
    Tensor h = ops::empty(ctx, x.shape(), dt);
    ops::add(ctx, h, x, r);
    Tensor out = ops::empty(ctx, x.shape(), dt);
    Tensor mean = ops::empty(ctx, Shape{N}, dt), rstd = ops::empty(ctx, Shape{N}, dt);
    ops::layernorm_forward(ctx, out, mean, rstd, h, w, b, 1e-5);
    Tensor rout = ops::empty(ctx, x.shape(), dt), rrstd = ops::empty(ctx, Shape{N}, dt);
    ops::rmsnorm_forward(ctx, rout, rrstd, h, w, 1e-6);
    // Fused: the same sum and the same outputs and statistics, bit for bit.
    Tensor sum = ops::empty(ctx, x.shape(), dt), out2 = ops::empty(ctx, x.shape(), dt);
    Tensor mean2 = ops::empty(ctx, Shape{N}, dt), rstd2 = ops::empty(ctx, Shape{N}, dt);
    ops::add_layernorm_forward(ctx, sum, out2, mean2, rstd2, x, r, w, b, 1e-5);
    CHECK(values(ctx, sum) == values(ctx, h));
    CHECK(values(ctx, out2) == values(ctx, out));
    CHECK(values(ctx, mean2) == values(ctx, mean));
    CHECK(values(ctx, rstd2) == values(ctx, rstd));
    Tensor rsum = ops::empty(ctx, x.shape(), dt), rout2 = ops::empty(ctx, x.shape(), dt);
    Tensor rrstd2 = ops::empty(ctx, Shape{N}, dt);
    ops::add_rmsnorm_forward(ctx, rsum, rout2, rrstd2, x, r, w, 1e-6);
    CHECK(values(ctx, rsum) == values(ctx, h));
    CHECK(values(ctx, rout2) == values(ctx, rout));
    CHECK(values(ctx, rrstd2) == values(ctx, rrstd));
    // sum may not overwrite the residual (the kernel reads it while writing sum).
    CHECK_THROWS_AS(ops::add_layernorm_forward(ctx, r, out2, mean2, rstd2, x, r, w, b, 1e-5),
                    ValueError);

    // Backward with an addend: dx = addend + the gradient, the addend left as it was, the
    // same as accumulating into a copy of it.
    Tensor dout = random_tensor(ctx, Shape{N, C}, dt, 15);
    Tensor addend = random_tensor(ctx, Shape{N, C}, dt, 16);
    const std::vector<double> addend_before = values(ctx, addend);
    Tensor acc = ops::clone(ctx, addend), dx = ops::empty(ctx, x.shape(), dt);
    Tensor dw = ops::zeros(ctx, Shape{C}, dt), db = ops::zeros(ctx, Shape{C}, dt);
    ops::layernorm_backward(ctx, acc, dw, db, dout, h, w, mean, rstd, true, true);
    ops::layernorm_backward(ctx, dx, dw, db, dout, h, w, mean, rstd, false, true, addend);
    CHECK(values(ctx, dx) == values(ctx, acc));
    CHECK(values(ctx, addend) == addend_before);
    Tensor racc = ops::clone(ctx, addend), rdx = ops::empty(ctx, x.shape(), dt);
    ops::rmsnorm_backward(ctx, racc, dw, dout, h, w, rrstd, true, true);
    ops::rmsnorm_backward(ctx, rdx, dw, dout, h, w, rrstd, false, true, addend);
    CHECK(values(ctx, rdx) == values(ctx, racc));
    // An addend with accumulate_dx is contradictory.
    CHECK_THROWS_AS(ops::layernorm_backward(ctx, dx, dw, db, dout, h, w, mean, rstd, true, true,
                                            addend),
                    ValueError);
  }
}

TEST_CASE("gelu and swiglu match their formulas and finite differences", "[kernels][nn]") {
  Context ctx;
  const DType dt = DType::f64;
  Tensor x = random_tensor(ctx, Shape{3, 8}, dt, 1, -4, 4);
  Tensor out = ops::empty(ctx, x.shape(), dt);
  ops::gelu_forward(ctx, out, x);
  const auto xv = values(ctx, x);
  std::vector<double> want(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    const double u = xv[i];
    want[i] = 0.5 * u * (1 + std::tanh(std::sqrt(2 / M_PI) * (u + 0.044715 * u * u * u)));
  }
  CHECK(max_rel_diff(values(ctx, out), want, 1e-3) < 1e-14);
  Tensor dout = random_tensor(ctx, x.shape(), dt, 2);
  auto gelu_loss = [&] {
    ops::gelu_forward(ctx, out, x);
    return weighted_sum(ctx, out, dout);
  };
  const auto gx = numeric_grad(x, gelu_loss);
  Tensor dx = ops::empty(ctx, x.shape(), dt);
  ops::gelu_backward(ctx, dx, dout, x);
  CHECK(max_rel_diff(values(ctx, dx), gx, 1.0) < kFdTol);
  // In place over dout.
  Tensor d2 = ops::clone(ctx, dout);
  ops::gelu_backward(ctx, d2, d2, x);
  CHECK(values(ctx, d2) == values(ctx, dx));

  // SwiGLU on a fused [gate | up] projection.
  const int64_t F = 5;
  Tensor gu = random_tensor(ctx, Shape{2, 3, 2 * F}, dt, 3, -3, 3);
  Tensor y = ops::empty(ctx, Shape{2, 3, F}, dt);
  ops::swiglu_forward(ctx, y, gu);
  const auto gv = values(ctx, gu), yv = values(ctx, y);
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t f = 0; f < F; ++f) {
      const double g = gv[size_t(r * 2 * F + f)], u = gv[size_t(r * 2 * F + F + f)];
      CHECK(yv[size_t(r * F + f)] == Approx(g / (1 + std::exp(-g)) * u).epsilon(1e-14));
    }
  Tensor dy = random_tensor(ctx, y.shape(), dt, 4);
  auto swiglu_loss = [&] {
    ops::swiglu_forward(ctx, y, gu);
    return weighted_sum(ctx, y, dy);
  };
  const auto ggu = numeric_grad(gu, swiglu_loss);
  Tensor dgu = ops::empty(ctx, gu.shape(), dt);
  ops::swiglu_backward(ctx, dgu, dy, gu);
  CHECK(max_rel_diff(values(ctx, dgu), ggu, 1.0) < kFdTol);
  CHECK_THROWS_AS(ops::swiglu_forward(ctx, ops::empty(ctx, Shape{2, 3, F + 1}, dt), gu), ShapeError);
}

TEST_CASE("rope from a strided view into a tensor of its own equals the view rotated in place",
          "[kernels][nn]") {
  Context ctx;
  const int64_t B = 2, T = 5, H = 3, Hkv = 1, D = 8;
  for (DType dt : {DType::f32, DType::f64}) {
    const Tensor qkv = random_tensor(ctx, Shape{B, T, (H + 2 * Hkv) * D}, dt, 2);
    const Tensor q = qkv.view(Shape{B, T, H + 2 * Hkv, D}).slice(2, 0, H);  // (B, T, H, D)
    for (int64_t offset : {0, 7}) {
      for (bool inverse : {false, true}) {
        const Tensor out = ops::empty(ctx, q.shape(), dt);
        ops::rope(ctx, out, q, 500.0, inverse, offset);
        const Tensor rotated = ops::contiguous(ctx, q);
        ops::rope_apply(ctx, rotated, 500.0, inverse, offset);
        CHECK(values(ctx, out) == values(ctx, rotated));
      }
    }
    // The input is left as it was.
    const auto before = values(ctx, qkv);
    ops::rope(ctx, ops::empty(ctx, q.shape(), dt), q, 500.0, false);
    CHECK(values(ctx, qkv) == before);
    // An output that overlaps the input without being it is refused; so is another shape.
    const Tensor k = qkv.view(Shape{B, T, H + 2 * Hkv, D}).slice(2, 1, H + 1);
    CHECK_THROWS_AS(ops::rope(ctx, k, q, 500.0, false), ValueError);
    CHECK_THROWS_AS(ops::rope(ctx, ops::empty(ctx, Shape{B, T, H, D + 2}, dt), q, 500.0, false),
                    ShapeError);
    // Two views of the same elements whose strides differ only where the size is 1 are in
    // place.
    const Tensor one = random_tensor(ctx, Shape{1, T, 1, D}, dt, 3);
    const Tensor other = one.as_strided(one.shape(), {99, D, 77, 1}, one.offset());
    const Tensor want = ops::clone(ctx, one);
    ops::rope_apply(ctx, want, 500.0, false, 0);
    ops::rope(ctx, other, one, 500.0, false);
    CHECK(values(ctx, one) == values(ctx, want));
  }
}

TEST_CASE("rope rotates strided q/k views by position; inverse undoes it", "[kernels][nn]") {
  Context ctx;
  const int64_t B = 2, T = 5, H = 3, Hkv = 1, D = 8;
  const double theta = 10000;
  for (DType dt : {DType::f32, DType::f64}) {
    // q is a view into a fused (B, T, (H + 2 Hkv) * D) projection.
    Tensor qkv = random_tensor(ctx, Shape{B, T, (H + 2 * Hkv) * D}, dt, 1);
    Tensor q = qkv.view(Shape{B, T, H + 2 * Hkv, D}).slice(2, 0, H);
    const auto before = values(ctx, qkv);
    ops::rope_apply(ctx, q, theta, false);
    const auto after = values(ctx, qkv);
    const int64_t W = (H + 2 * Hkv) * D;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H + 2 * Hkv; ++h)
          for (int64_t i = 0; i < D / 2; ++i) {
            const size_t o = size_t(b * T * W + t * W + h * D);
            const double x1 = before[o + size_t(i)], x2 = before[o + size_t(i + D / 2)];
            double w1 = x1, w2 = x2;
            if (h < H) {  // only q's heads move; k and v stay as they were
              const double a = t * std::pow(theta, -2.0 * i / D);
              w1 = x1 * std::cos(a) - x2 * std::sin(a);
              w2 = x2 * std::cos(a) + x1 * std::sin(a);
            }
            const double tol = dt == DType::f32 ? 1e-6 : 1e-14;
            CHECK(after[o + size_t(i)] == Approx(w1).margin(tol));
            CHECK(after[o + size_t(i + D / 2)] == Approx(w2).margin(tol));
          }
    ops::rope_apply(ctx, q, theta, true);
    CHECK(max_rel_diff(values(ctx, qkv), before, 1.0) < (dt == DType::f32 ? 1e-6 : 1e-14));
  }
}
