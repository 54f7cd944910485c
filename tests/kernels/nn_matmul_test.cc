// CPU matmul, batched matmul and bias backward against direct formulas.
#include <omp.h>

#include <chrono>
#include <cmath>

#include "kernels/cpu/matmul.h"
#include "kernels/ops.h"
#include "kernels/scalar_math.h"
#include "tests/kernels/nn_test_util.h"
#include "tests/test_support.h"

using namespace fsdp;
using fsdp::testing::max_rel_diff;
using fsdp::testing::random_tensor;
using fsdp::testing::values;

namespace {

// op(x)(i, j) of a row-major matrix given as values, x stored (rows, cols).
double op_at(const std::vector<double>& x, int64_t cols, bool trans, int64_t i, int64_t j) {
  return trans ? x[size_t(j * cols + i)] : x[size_t(i * cols + j)];
}

// out = alpha * op(a) @ op(b) + beta * out0 + bias, in double.
std::vector<double> naive_matmul(const std::vector<double>& a, const std::vector<double>& b,
                                 const std::vector<double>& out0, const std::vector<double>& bias,
                                 int64_t m, int64_t n, int64_t k, bool ta, bool tb, double alpha,
                                 double beta) {
  std::vector<double> out(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p)
        s += op_at(a, ta ? m : k, ta, i, p) * op_at(b, tb ? k : n, tb, p, j);
      double v = alpha * s;
      if (beta != 0) v += beta * out0[size_t(i * n + j)];
      if (!bias.empty()) v += bias[size_t(j)];
      out[size_t(i * n + j)] = v;
    }
  return out;
}

Shape operand_shape(int64_t rows, int64_t cols, bool trans) {
  return trans ? Shape{cols, rows} : Shape{rows, cols};
}

}  // namespace

TEST_CASE("matmul matches the direct formula for every transpose, alpha, beta and bias",
          "[kernels][nn]") {
  Context ctx;
  // Sizes off every tile multiple (96 x 128 tiles, 256-deep K slices, 6 x 16 inner blocks).
  const int64_t m = 101, n = 133, k = 517;
  for (DType dt : {DType::f32, DType::f64}) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      INFO(dtype_name(dt) << " trans_a " << ta << " trans_b " << tb);
      Tensor a = random_tensor(ctx, operand_shape(m, k, ta), dt, 1);
      Tensor b = random_tensor(ctx, operand_shape(k, n, tb), dt, 2);
      Tensor bias = random_tensor(ctx, Shape{n}, dt, 3);
      Tensor out = random_tensor(ctx, Shape{m, n}, dt, 4);
      const std::vector<double> out0 = values(ctx, out);
      ops::matmul(ctx, out, a, b, ta, tb, 0.5, 0.25, bias);
      const std::vector<double> want = naive_matmul(values(ctx, a), values(ctx, b), out0,
                                                    values(ctx, bias), m, n, k, ta, tb, 0.5, 0.25);
      // f32: k = 517 products of |x| <= 1 summed in f32: error ~ sqrt(k) * 2^-24 * |terms|,
      // far below 1e-5 of the result's scale (~ sqrt(k) / 3); f64 to 1e-12.
      const double tol = dt == DType::f32 ? 1e-5 : 1e-12;
      CHECK(max_rel_diff(values(ctx, out), want, 1.0) < tol);
    }
  }
}

TEST_CASE("matmul beta = 0 ignores the old output, NaN included", "[kernels][nn]") {
  Context ctx;
  Tensor a = random_tensor(ctx, Shape{7, 5}, DType::f32, 1);
  Tensor b = random_tensor(ctx, Shape{5, 9}, DType::f32, 2);
  Tensor out = ops::full(ctx, Shape{7, 9}, DType::f32, NAN);
  ops::matmul(ctx, out, a, b, false, false);
  const std::vector<double> want =
      naive_matmul(values(ctx, a), values(ctx, b), {}, {}, 7, 9, 5, false, false, 1.0, 0.0);
  CHECK(max_rel_diff(values(ctx, out), want, 1.0) < 1e-6);
}

TEST_CASE("matmul accumulates f32 products into an f64 output (f64 gradient accumulation)",
          "[kernels][nn]") {
  Context ctx;
  // dW (N, K) += dout^T (N, M) @ x (M, K): a weight gradient, accumulated twice.
  const int64_t m = 64, n = 48, k = 40;
  Tensor dout = random_tensor(ctx, Shape{m, n}, DType::f32, 5);
  Tensor x = random_tensor(ctx, Shape{m, k}, DType::f32, 6);
  Tensor dw = ops::zeros(ctx, Shape{n, k}, DType::f64);
  ops::matmul(ctx, dw, dout, x, true, false, 1.0, 1.0);
  ops::matmul(ctx, dw, dout, x, true, false, 1.0, 1.0);
  std::vector<double> want =
      naive_matmul(values(ctx, dout), values(ctx, x), {}, {}, n, k, m, true, false, 2.0, 0.0);
  // The products are accumulated in f32 (the compute type): 64 terms, |x| <= 1.
  CHECK(max_rel_diff(values(ctx, dw), want, 1.0) < 1e-5);
  // A narrower output than the inputs is refused.
  CHECK_THROWS_AS(ops::matmul(ctx, ops::zeros(ctx, Shape{n, k}, DType::f32),
                              ops::cast(ctx, dout, DType::f64), ops::cast(ctx, x, DType::f64),
                              true, false),
                  DTypeError);
}

TEST_CASE("matmul DGelu epilogue multiplies the product by gelu'(aux)", "[kernels][nn]") {
  Context ctx;
  const int64_t m = 33, n = 70, k = 29;
  for (DType dt : {DType::f32, DType::f64}) {
    // The backward of a GELU layer: dpre (M, N) = (dy (M, K) @ W (K, N)) * gelu'(pre (M, N)).
    Tensor dy = random_tensor(ctx, Shape{m, k}, dt, 17);
    Tensor w = random_tensor(ctx, Shape{k, n}, dt, 18);
    Tensor pre = random_tensor(ctx, Shape{m, n}, dt, 19, -3, 3);
    Tensor out = ops::empty(ctx, Shape{m, n}, dt);
    ops::matmul(ctx, out, dy, w, false, false, 1.0, 0.0, Tensor(), ops::Epilogue::DGelu, pre);
    std::vector<double> want = naive_matmul(values(ctx, dy), values(ctx, w), {}, {}, m, n, k,
                                            false, false, 1.0, 0.0);
    const auto p = values(ctx, pre);
    for (size_t i = 0; i < want.size(); ++i) want[i] *= kernels::gelu_tanh_grad(p[i]);
    CHECK(max_rel_diff(values(ctx, out), want, 1.0) < (dt == DType::f32 ? 1e-5 : 1e-12));
    // The same as the unfused pair: matmul, then gelu_backward.
    Tensor da = ops::empty(ctx, Shape{m, n}, dt), dpre = ops::empty(ctx, Shape{m, n}, dt);
    ops::matmul(ctx, da, dy, w, false, false);
    ops::gelu_backward(ctx, dpre, da, pre);
    CHECK(max_rel_diff(values(ctx, out), values(ctx, dpre), 1.0) < (dt == DType::f32 ? 1e-5 : 1e-12));
  }
}

TEST_CASE("matmul_bias_grad: a linear layer's weight and bias gradients", "[kernels][nn]") {
  Context ctx;
  const int64_t tokens = 37, out_f = 11, in_f = 6;
  Tensor dy = random_tensor(ctx, Shape{tokens, out_f}, DType::f64, 51);
  Tensor x = random_tensor(ctx, Shape{tokens, in_f}, DType::f64, 52);
  Tensor dw = random_tensor(ctx, Shape{out_f, in_f}, DType::f64, 53);
  Tensor db = random_tensor(ctx, Shape{out_f}, DType::f64, 54);
  const auto dw0 = values(ctx, dw), db0 = values(ctx, db);
  ops::matmul_bias_grad(ctx, dw, dy, x, true, false, 1.0, 1.0, db, true);
  const std::vector<double> prod = naive_matmul(values(ctx, dy), values(ctx, x), {}, {}, out_f,
                                                in_f, tokens, true, false, 1.0, 0.0);
  const auto g = values(ctx, dy);
  std::vector<double> want_w(dw0), want_b(db0);
  for (size_t i = 0; i < want_w.size(); ++i) want_w[i] += prod[i];
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t o = 0; o < out_f; ++o) want_b[size_t(o)] += g[size_t(t * out_f + o)];
  CHECK(max_rel_diff(values(ctx, dw), want_w, 1.0) < 1e-12);
  CHECK(max_rel_diff(values(ctx, db), want_b, 1.0) < 1e-12);
  // Not accumulating: the bias gradient is overwritten.
  ops::matmul_bias_grad(ctx, dw, dy, x, true, false, 1.0, 1.0, db, false);
  for (size_t o = 0; o < want_b.size(); ++o) want_b[o] -= db0[o];
  CHECK(max_rel_diff(values(ctx, db), want_b, 1.0) < 1e-12);
  // The bias gradient is dy's column sums: dy must be transposed, alpha 1.
  CHECK_THROWS_AS(ops::matmul_bias_grad(ctx, dw, dy, x, false, false, 1.0, 1.0, db, true),
                  ShapeError);
  CHECK_THROWS_AS(ops::matmul_bias_grad(ctx, dw, dy, x, true, false, 0.5, 1.0, db, true),
                  ValueError);
}

TEST_CASE("matmul GELU epilogue writes gelu(out) and the pre-activation", "[kernels][nn]") {
  Context ctx;
  const int64_t m = 33, n = 70, k = 29;
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor a = random_tensor(ctx, Shape{m, k}, dt, 7);
    Tensor w = random_tensor(ctx, Shape{n, k}, dt, 8);  // a Linear weight (out, in)
    Tensor bias = random_tensor(ctx, Shape{n}, dt, 9);
    Tensor out = ops::empty(ctx, Shape{m, n}, dt), aux = ops::empty(ctx, Shape{m, n}, dt);
    ops::matmul(ctx, out, a, w, false, true, 1.0, 0.0, bias, ops::Epilogue::Gelu, aux);
    const std::vector<double> pre =
        naive_matmul(values(ctx, a), values(ctx, w), {}, values(ctx, bias), m, n, k, false, true,
                     1.0, 0.0);
    std::vector<double> act(pre.size());
    for (size_t i = 0; i < pre.size(); ++i) act[i] = kernels::gelu_tanh(pre[i]);
    const double tol = dt == DType::f32 ? 1e-5 : 1e-12;
    CHECK(max_rel_diff(values(ctx, aux), pre, 1.0) < tol);
    CHECK(max_rel_diff(values(ctx, out), act, 1.0) < tol);
  }
  Tensor a = random_tensor(ctx, Shape{4, 4}, DType::f32, 1);
  Tensor o = ops::zeros(ctx, Shape{4, 4}, DType::f32);
  CHECK_THROWS_AS(ops::matmul(ctx, o, a, a, false, false, 1.0, 1.0, Tensor(), ops::Epilogue::Gelu),
                  ValueError);
  // DGelu reads aux, takes no bias and no beta.
  CHECK_THROWS_AS(ops::matmul(ctx, o, a, a, false, false, 1.0, 0.0, Tensor(), ops::Epilogue::DGelu),
                  ValueError);
  CHECK_THROWS_AS(ops::matmul(ctx, o, a, a, false, false, 1.0, 0.0,
                              ops::zeros(ctx, Shape{4}, DType::f32), ops::Epilogue::DGelu, a),
                  ValueError);
  CHECK_THROWS_AS(ops::matmul(ctx, o, a, a, false, false, 1.0, 1.0, Tensor(), ops::Epilogue::DGelu, a),
                  ValueError);
  CHECK_THROWS_AS(ops::matmul(ctx, o, a, ops::zeros(ctx, Shape{5, 4}, DType::f32), false, false),
                  ShapeError);
  CHECK_THROWS_AS(ops::matmul(ctx, o, a, a, false, false, 1.0, 0.0,
                              ops::zeros(ctx, Shape{3}, DType::f32)),
                  ShapeError);
}

TEST_CASE("matmul is bitwise deterministic and independent of the thread count",
          "[kernels][nn]") {
  Context ctx;
  // (m, n, k): several tiles of K-deep products; several OpenBLAS tiles (256 x 1024) both
  // ways; one tile below the parallel threshold (where OpenBLAS's own threads, were they
  // used, would split the f64 product by thread count and change its bits); one tile with a
  // long K above it.
  const int64_t shapes[][3] = {{300, 260, 700}, {600, 2100, 64}, {100, 100, 100}, {64, 64, 6000}};
  const int saved = omp_get_max_threads();
  for (DType dt : {DType::f32, DType::f64}) {
    for (const auto& s : shapes) {
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        INFO(dtype_name(dt) << " (" << s[0] << ", " << s[1] << ", " << s[2] << ") trans_a "
                            << ta << " trans_b " << tb);
        Tensor a = random_tensor(ctx, operand_shape(s[0], s[2], ta), dt, 11);
        Tensor b = random_tensor(ctx, operand_shape(s[2], s[1], tb), dt, 12);
        std::vector<std::vector<double>> got;
        for (int threads : {1, 2, 3}) {
          Tensor out = ops::empty(ctx, Shape{s[0], s[1]}, dt);
          omp_set_num_threads(threads);
          ops::matmul(ctx, out, a, b, ta, tb);
          omp_set_num_threads(saved);
          got.push_back(values(ctx, out));
        }
        CHECK(got[0] == got[1]);
        CHECK(got[0] == got[2]);
      }
    }
  }
}

TEST_CASE("matmul takes its products from OpenBLAS's OpenMP build", "[kernels][nn]") {
  // //third_party/openblas links it and points the run path at it; another build found first
  // (LD_LIBRARY_PATH) would leave every product to the hand-written kernel.
  CHECK(kernels::cpu::matmul_uses_openblas());
}

TEST_CASE("the hand-written kernel (the fallback) matches the direct formula and OpenBLAS",
          "[kernels][nn]") {
  Context ctx;
  // Sizes off every tile multiple of both (96 x 128 tiles, 256-deep K slices, 6 x 16 inner
  // blocks; 256 x 1024 OpenBLAS tiles).
  const int64_t m = 301, n = 1030, k = 300;
  for (DType dt : {DType::f32, DType::f64}) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      INFO(dtype_name(dt) << " trans_a " << ta << " trans_b " << tb);
      Tensor a = random_tensor(ctx, operand_shape(m, k, ta), dt, 1);
      Tensor b = random_tensor(ctx, operand_shape(k, n, tb), dt, 2);
      Tensor bias = random_tensor(ctx, Shape{n}, dt, 3);
      Tensor out0 = random_tensor(ctx, Shape{m, n}, dt, 4);
      Tensor blocked = ops::clone(ctx, out0), blas = ops::clone(ctx, out0);
      kernels::MatmulDims d;
      d.m = m;
      d.n = n;
      d.k = k;
      d.trans_a = ta;
      d.trans_b = tb;
      kernels::cpu::blocked_matmul(d, blocked.data_ptr(), dt, a.data_ptr(), b.data_ptr(), dt,
                                   0.5, 0.25, bias.data_ptr(), nullptr,
                                   kernels::MatmulEpilogue::None);
      kernels::cpu::matmul(d, blas.data_ptr(), dt, a.data_ptr(), b.data_ptr(), dt, 0.5, 0.25,
                           bias.data_ptr(), nullptr, kernels::MatmulEpilogue::None);
      const std::vector<double> want =
          naive_matmul(values(ctx, a), values(ctx, b), values(ctx, out0), values(ctx, bias), m,
                       n, k, ta, tb, 0.5, 0.25);
      const double tol = dt == DType::f32 ? 1e-5 : 1e-12;
      CHECK(max_rel_diff(values(ctx, blocked), want, 1.0) < tol);
      CHECK(max_rel_diff(values(ctx, blas), values(ctx, blocked), 1.0) < tol);
    }
  }
}

TEST_CASE("batched_matmul equals one matmul per batch", "[kernels][nn]") {
  Context ctx;
  const int64_t bt = 3, m = 17, n = 23, k = 19;
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    Tensor a = random_tensor(ctx, ta ? Shape{bt, k, m} : Shape{bt, m, k}, DType::f64, 21);
    Tensor b = random_tensor(ctx, tb ? Shape{bt, n, k} : Shape{bt, k, n}, DType::f64, 22);
    Tensor out = random_tensor(ctx, Shape{bt, m, n}, DType::f64, 23);
    Tensor ref = ops::clone(ctx, out);
    ops::batched_matmul(ctx, out, a, b, ta, tb, 2.0, 0.5);
    for (int64_t i = 0; i < bt; ++i)
      ops::matmul(ctx, ref.select(0, i), a.select(0, i), b.select(0, i), ta, tb, 2.0, 0.5);
    CHECK(values(ctx, out) == values(ctx, ref));
  }
  CHECK_THROWS_AS(ops::batched_matmul(ctx, ops::zeros(ctx, Shape{2, 3, 3}, DType::f32),
                                      ops::zeros(ctx, Shape{3, 3, 3}, DType::f32),
                                      ops::zeros(ctx, Shape{3, 3, 3}, DType::f32), false, false),
                  ShapeError);
}

TEST_CASE("bias_backward sums rows, overwriting or accumulating, into f32 or f64", "[kernels][nn]") {
  Context ctx;
  const int64_t m = 37, n = 11;
  Tensor dout = random_tensor(ctx, Shape{m, n}, DType::f32, 31);
  const std::vector<double> g = values(ctx, dout);
  std::vector<double> col(size_t(n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) col[size_t(j)] += g[size_t(i * n + j)];
  for (DType gd : {DType::f32, DType::f64}) {
    Tensor db = ops::full(ctx, Shape{n}, gd, 100.0);
    ops::bias_backward(ctx, db, dout, false);
    CHECK(max_rel_diff(values(ctx, db), col, 1.0) < 1e-6);
    ops::bias_backward(ctx, db, dout, true);
    std::vector<double> twice = col;
    for (double& x : twice) x *= 2;
    CHECK(max_rel_diff(values(ctx, db), twice, 1.0) < 1e-6);
  }
  // (B, T, C) gradients are summed over B and T.
  Tensor db = ops::zeros(ctx, Shape{n}, DType::f64);
  ops::bias_backward(ctx, db, dout.view(Shape{1, m, n}), false);
  CHECK(max_rel_diff(values(ctx, db), col, 1.0) < 1e-12);
}

// Not a pass/fail test: prints the CPU matmul throughput (run with [.bench]).
TEST_CASE("CPU matmul throughput", "[.bench]") {
  Context ctx;
  const int64_t s = 512;
  Tensor a = random_tensor(ctx, Shape{s, s}, DType::f32, 1);
  Tensor b = random_tensor(ctx, Shape{s, s}, DType::f32, 2);
  Tensor out = ops::empty(ctx, Shape{s, s}, DType::f32);
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    ops::matmul(ctx, out, a, b, ta, tb);
    const int reps = 20;
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) ops::matmul(ctx, out, a, b, ta, tb);
    const double sec =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    WARN("512^3 f32 trans_a " << ta << " trans_b " << tb << ": "
                              << 2.0 * s * s * s * reps / sec / 1e9 << " GFLOP/s");
  }
}
