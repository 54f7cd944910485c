// CPU causal grouped-query attention against a materialized softmax(QK^T)V, and its backward
// against f64 finite differences, on q/k/v views into one fused projection.
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

struct Qkv {
  Tensor fused, q, k, v;  // fused (B, T, (H + 2 Hkv) * D); q/k/v strided views into it
};

Qkv fused_qkv(const Tensor& fused, int64_t H, int64_t Hkv, int64_t D) {
  const Tensor heads = fused.view(Shape{fused.size(0), fused.size(1), H + 2 * Hkv, D});
  return {fused, heads.slice(2, 0, H), heads.slice(2, H, H + Hkv),
          heads.slice(2, H + Hkv, H + 2 * Hkv)};
}

// Materialized reference: out (B, T, H, D) and lse (B, H, T) as value lists.
void naive_attention(Context& ctx, const Qkv& x, double scale, std::vector<double>& out,
                     std::vector<double>& lse) {
  const int64_t B = x.q.size(0), T = x.q.size(1), H = x.q.size(2), Hkv = x.k.size(2),
                D = x.q.size(3);
  const auto q = values(ctx, x.q), k = values(ctx, x.k), v = values(ctx, x.v);
  out.assign(size_t(B * T * H * D), 0.0);
  lse.assign(size_t(B * H * T), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> s(size_t(T), -INFINITY);
        double m = -INFINITY;
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += q[size_t(((b * T + t) * H + h) * D + d)] * k[size_t(((b * T + j) * Hkv + g) * D + d)];
          s[size_t(j)] = scale * dot;
          m = std::max(m, s[size_t(j)]);
        }
        double z = 0;
        for (int64_t j = 0; j <= t; ++j) z += std::exp(s[size_t(j)] - m);
        lse[size_t((b * H + h) * T + t)] = m + std::log(z);
        for (int64_t j = 0; j <= t; ++j)
          for (int64_t d = 0; d < D; ++d)
            out[size_t(((b * T + t) * H + h) * D + d)] +=
                std::exp(s[size_t(j)] - m) / z * v[size_t(((b * T + j) * Hkv + g) * D + d)];
      }
    }
}

}  // namespace

TEST_CASE("attention forward matches the materialized softmax, with GQA and strided views",
          "[kernels][nn]") {
  Context ctx;
  const int64_t B = 2, T = 7, H = 6, Hkv = 2, D = 8;
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(dtype_name(dt));
    const Qkv x = fused_qkv(random_tensor(ctx, Shape{B, T, (H + 2 * Hkv) * D}, dt, 1, -2, 2), H,
                            Hkv, D);
    Tensor out = ops::empty(ctx, Shape{B, T, H, D}, dt);
    Tensor lse = ops::empty(ctx, Shape{B, H, T}, dt);
    ops::attention_forward(ctx, out, lse, x.q, x.k, x.v);
    std::vector<double> want_out, want_lse;
    naive_attention(ctx, x, 1 / std::sqrt(double(D)), want_out, want_lse);
    const double tol = dt == DType::f32 ? 1e-6 : 1e-13;
    CHECK(max_rel_diff(values(ctx, out), want_out, 1.0) < tol);
    CHECK(max_rel_diff(values(ctx, lse), want_lse, 1.0) < tol);
    // The first query attends only to the first key: its output is v[0].
    const auto o = values(ctx, out), vv = values(ctx, x.v);
    CHECK(o[size_t(5 * D + 3)] == Approx(vv[size_t(1 * D + 3)]).epsilon(tol));  // head 5 -> kv 1
    // An explicit scale is honoured.
    ops::attention_forward(ctx, out, lse, x.q, x.k, x.v, 0.3);
    naive_attention(ctx, x, 0.3, want_out, want_lse);
    CHECK(max_rel_diff(values(ctx, out), want_out, 1.0) < tol);
  }
  Tensor q = ops::zeros(ctx, Shape{1, 2, 3, 4}, DType::f32);
  Tensor kv = ops::zeros(ctx, Shape{1, 2, 2, 4}, DType::f32);
  CHECK_THROWS_AS(ops::attention_forward(ctx, ops::zeros(ctx, q.shape(), DType::f32),
                                         ops::zeros(ctx, Shape{1, 3, 2}, DType::f32), q, kv, kv),
                  ShapeError);  // 3 heads cannot share 2 kv heads
  Tensor strided_d = ops::zeros(ctx, Shape{1, 2, 3, 8}, DType::f32).slice(3, 0, 8, 2);
  CHECK_THROWS_AS(ops::attention_forward(ctx, ops::zeros(ctx, Shape{1, 2, 3, 4}, DType::f32),
                                         ops::zeros(ctx, Shape{1, 3, 2}, DType::f32), strided_d,
                                         strided_d, strided_d),
                  ShapeError);  // D must be contiguous
}

TEST_CASE("attention backward matches finite differences and overwrites strided grads",
          "[kernels][nn]") {
  Context ctx;
  const int64_t B = 2, T = 5, H = 4, Hkv = 2, D = 4;
  const DType dt = DType::f64;
  const Qkv x = fused_qkv(random_tensor(ctx, Shape{B, T, (H + 2 * Hkv) * D}, dt, 3, -1.5, 1.5), H,
                          Hkv, D);
  Tensor dout = random_tensor(ctx, Shape{B, T, H, D}, dt, 4);
  Tensor out = ops::empty(ctx, Shape{B, T, H, D}, dt);
  Tensor lse = ops::empty(ctx, Shape{B, H, T}, dt);
  auto loss = [&] {
    ops::attention_forward(ctx, out, lse, x.q, x.k, x.v);
    return weighted_sum(ctx, out, dout);
  };
  const auto gq = numeric_grad(x.q, loss), gk = numeric_grad(x.k, loss), gv = numeric_grad(x.v, loss);
  loss();
  // Gradients land in views of one fused buffer that holds garbage beforehand.
  const Qkv d = fused_qkv(ops::full(ctx, x.fused.shape(), dt, 1e3), H, Hkv, D);
  ops::attention_backward(ctx, d.q, d.k, d.v, dout, out, lse, x.q, x.k, x.v);
  const double tol = 1e-7;  // f64 central differences (see nn_layers_test.cc)
  CHECK(max_rel_diff(values(ctx, d.q), gq, 1.0) < tol);
  CHECK(max_rel_diff(values(ctx, d.k), gk, 1.0) < tol);
  CHECK(max_rel_diff(values(ctx, d.v), gv, 1.0) < tol);

  // f32 agrees with f64 to f32 rounding, on a strided dout too.
  const Qkv xf = fused_qkv(ops::cast(ctx, x.fused, DType::f32), H, Hkv, D);
  Tensor dout_wide = ops::zeros(ctx, Shape{B, T, H, 2 * D}, DType::f32);
  Tensor doutf = dout_wide.slice(3, 0, D);
  ops::copy(ctx, doutf, dout);
  Tensor outf = ops::empty(ctx, out.shape(), DType::f32);
  Tensor lsef = ops::empty(ctx, lse.shape(), DType::f32);
  ops::attention_forward(ctx, outf, lsef, xf.q, xf.k, xf.v);
  const Qkv df = fused_qkv(ops::zeros(ctx, x.fused.shape(), DType::f32), H, Hkv, D);
  ops::attention_backward(ctx, df.q, df.k, df.v, doutf, outf, lsef, xf.q, xf.k, xf.v);
  CHECK(max_rel_diff(values(ctx, df.q), gq, 1.0) < 1e-5);
  CHECK(max_rel_diff(values(ctx, df.k), gk, 1.0) < 1e-5);
  CHECK(max_rel_diff(values(ctx, df.v), gv, 1.0) < 1e-5);
}

TEST_CASE("a chunk of queries after earlier keys gives the full sequence's rows (f64)",
          "[kernels][nn]") {
  // Context parallelism's block: queries [g, g + c) of a T-token sequence against keys
  // [0, g + c). Forward: the full attention's rows; backward with the full gradient zero
  // outside the chunk: the full backward's dq rows and its dk, dv over the first g + c keys.
  Context ctx;
  const int64_t B = 2, T = 12, H = 4, Hkv = 2, D = 8, g = 5, c = 4;
  const Tensor q = random_tensor(ctx, Shape{B, T, H, D}, DType::f64, 31, -1, 1);
  const Tensor k = random_tensor(ctx, Shape{B, T, Hkv, D}, DType::f64, 32, -1, 1);
  const Tensor v = random_tensor(ctx, Shape{B, T, Hkv, D}, DType::f64, 33, -1, 1);
  const Tensor dout = ops::zeros(ctx, Shape{B, T, H, D}, DType::f64);
  ops::copy(ctx, dout.narrow(1, g, c), random_tensor(ctx, Shape{B, c, H, D}, DType::f64, 34, -1, 1));
  const Tensor out = ops::empty(ctx, Shape{B, T, H, D}, DType::f64);
  const Tensor lse = ops::empty(ctx, Shape{B, H, T}, DType::f64);
  ops::attention_forward(ctx, out, lse, q, k, v);
  const Tensor dq = ops::empty(ctx, Shape{B, T, H, D}, DType::f64);
  const Tensor dk = ops::empty(ctx, Shape{B, T, Hkv, D}, DType::f64), dv = ops::empty(ctx, Shape{B, T, Hkv, D}, DType::f64);
  ops::attention_backward(ctx, dq, dk, dv, dout, out, lse, q, k, v);

  const Tensor qc = q.narrow(1, g, c), kc = k.narrow(1, 0, g + c), vc = v.narrow(1, 0, g + c);
  const Tensor out_c = ops::empty(ctx, Shape{B, c, H, D}, DType::f64);
  const Tensor lse_c = ops::empty(ctx, Shape{B, H, c}, DType::f64);
  ops::attention_forward(ctx, out_c, lse_c, qc, kc, vc);
  CHECK(max_rel_diff(values(ctx, out_c), values(ctx, ops::contiguous(ctx, out.narrow(1, g, c))), 1.0) < 1e-14);
  CHECK(max_rel_diff(values(ctx, lse_c), values(ctx, ops::contiguous(ctx, lse.narrow(2, g, c))), 1.0) < 1e-14);
  const Tensor dq_c = ops::empty(ctx, Shape{B, c, H, D}, DType::f64);
  const Tensor dk_c = ops::empty(ctx, Shape{B, g + c, Hkv, D}, DType::f64);
  const Tensor dv_c = ops::empty(ctx, Shape{B, g + c, Hkv, D}, DType::f64);
  ops::attention_backward(ctx, dq_c, dk_c, dv_c, ops::contiguous(ctx, dout.narrow(1, g, c)), out_c, lse_c,
                          qc, kc, vc);
  CHECK(max_rel_diff(values(ctx, dq_c), values(ctx, ops::contiguous(ctx, dq.narrow(1, g, c))), 1.0) < 1e-13);
  CHECK(max_rel_diff(values(ctx, dk_c), values(ctx, ops::contiguous(ctx, dk.narrow(1, 0, g + c))), 1.0) < 1e-13);
  CHECK(max_rel_diff(values(ctx, dv_c), values(ctx, ops::contiguous(ctx, dv.narrow(1, 0, g + c))), 1.0) < 1e-13);
  // Keys shorter than the queries are refused.
  CHECK_THROWS_AS(ops::attention_forward(ctx, out_c, lse_c, qc, k.narrow(1, 0, c - 1), v.narrow(1, 0, c - 1)),
                  ShapeError);
}

TEST_CASE("ring blocks merged by their log-sum-exps give the whole attention (f64)",
          "[kernels][nn]") {
  // Queries [4, 8) against keys [0, 8) as two blocks: keys [0, 4) unmasked and keys [4, 8)
  // under the causal mask, merged, against the chunk's attention over all 8 keys at once.
  Context ctx;
  const int64_t B = 2, c = 4, H = 4, Hkv = 2, D = 8;
  const Tensor q = random_tensor(ctx, Shape{B, c, H, D}, DType::f64, 41, -1, 1);
  const Tensor k = random_tensor(ctx, Shape{B, 2 * c, Hkv, D}, DType::f64, 42, -1, 1);
  const Tensor v = random_tensor(ctx, Shape{B, 2 * c, Hkv, D}, DType::f64, 43, -1, 1);
  const Tensor want = ops::empty(ctx, Shape{B, c, H, D}, DType::f64);
  const Tensor want_lse = ops::empty(ctx, Shape{B, H, c}, DType::f64);
  ops::attention_forward(ctx, want, want_lse, q, k, v);
  const Tensor out = ops::zeros(ctx, Shape{B, c, H, D}, DType::f64);
  const Tensor lse = ops::full(ctx, Shape{B, H, c}, DType::f64, -INFINITY);
  const Tensor block = ops::empty(ctx, Shape{B, c, H, D}, DType::f64);
  const Tensor block_lse = ops::empty(ctx, Shape{B, H, c}, DType::f64);
  for (int j = 0; j < 2; ++j) {
    ops::attention_forward(ctx, block, block_lse, q, k.narrow(1, j * c, c), v.narrow(1, j * c, c),
                           0.0, /*causal=*/j == 1);
    ops::attention_merge(ctx, out, lse, block, block_lse);
  }
  CHECK(max_rel_diff(values(ctx, out), values(ctx, want), 1.0) < 1e-14);
  CHECK(max_rel_diff(values(ctx, lse), values(ctx, want_lse), 1.0) < 1e-14);
  // Each block's backward against the merged output and log-sum-exp gives its part of the
  // whole gradient.
  const Tensor dout = random_tensor(ctx, Shape{B, c, H, D}, DType::f64, 44, -1, 1);
  const Tensor dq = ops::empty(ctx, Shape{B, c, H, D}, DType::f64);
  const Tensor dk = ops::empty(ctx, Shape{B, 2 * c, Hkv, D}, DType::f64), dv = ops::empty(ctx, Shape{B, 2 * c, Hkv, D}, DType::f64);
  ops::attention_backward(ctx, dq, dk, dv, dout, want, want_lse, q, k, v);
  std::vector<double> dq_sum(size_t(B * c * H * D), 0.0);
  for (int j = 0; j < 2; ++j) {
    const Tensor dq_b = ops::empty(ctx, Shape{B, c, H, D}, DType::f64);
    const Tensor dk_b = ops::empty(ctx, Shape{B, c, Hkv, D}, DType::f64), dv_b = ops::empty(ctx, Shape{B, c, Hkv, D}, DType::f64);
    ops::attention_backward(ctx, dq_b, dk_b, dv_b, dout, out, lse, q, k.narrow(1, j * c, c),
                            v.narrow(1, j * c, c), 0.0, j == 1);
    const auto part = values(ctx, dq_b);
    for (size_t i = 0; i < dq_sum.size(); ++i) dq_sum[i] += part[i];
    CHECK(max_rel_diff(values(ctx, dk_b), values(ctx, ops::contiguous(ctx, dk.narrow(1, j * c, c))), 1.0) < 1e-13);
    CHECK(max_rel_diff(values(ctx, dv_b), values(ctx, ops::contiguous(ctx, dv.narrow(1, j * c, c))), 1.0) < 1e-13);
  }
  CHECK(max_rel_diff(dq_sum, values(ctx, dq), 1.0) < 1e-13);
}
