// FP8 on the CPU: the software rounding (kernels/fp8_format.h) against a brute-force
// nearest-value search over all 256 codes of each format, quantization's scale and layouts,
// and the FP8 matmul against the product of the decoded values; block scaling (1x128 and
// 128x128 blocks) against a scalar reference of each block, and the block-scaled matmul
// against the f64 product of the dequantized operands; row scaling (each row, and each
// column for the transposed layout, by its own amax) the same way.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/ops.h"
#include "tests/kernels/nn_test_util.h"
#include "tests/test_support.h"

using namespace fsdp;
using kernels::Fp8Format;
using kernels::fp8_decode;
using kernels::fp8_encode;

namespace {

// The code nearest to v among the finite codes of `f`, ties to the even code (the one whose
// last mantissa bit is 0), saturating to +-max; NaN -> 0x7f with v's sign.
uint8_t nearest_code(float v, Fp8Format f) {
  if (std::isnan(v)) return uint8_t((std::signbit(v) ? 0x80 : 0) | 0x7f);
  int best = -1;
  double best_d = 0;
  for (int c = 0; c < 256; ++c) {
    const float x = fp8_decode(uint8_t(c), f);
    if (!std::isfinite(x)) continue;
    if ((c & 0x80) != (std::signbit(v) ? 0x80 : 0)) continue;  // keep the sign, as for -0
    const double d = std::fabs(double(x) - double(v));
    if (best < 0 || d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return uint8_t(best);
}

}  // namespace

TEST_CASE("fp8 codes decode and encode back to themselves", "[fp8]") {
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2})
    for (int c = 0; c < 256; ++c) {
      const float x = fp8_decode(uint8_t(c), f);
      if (!std::isfinite(x)) continue;
      INFO(kernels::fp8_format_name(f) << " code " << c << " = " << x);
      CHECK(fp8_encode(x, f) == uint8_t(c));
    }
  CHECK(fp8_decode(0x7e, Fp8Format::e4m3) == 448.0f);
  CHECK(fp8_decode(0x7b, Fp8Format::e5m2) == 57344.0f);
  CHECK(fp8_decode(0x01, Fp8Format::e4m3) == std::ldexp(1.0f, -9));  // smallest subnormal
  CHECK(fp8_decode(0x01, Fp8Format::e5m2) == std::ldexp(1.0f, -16));
  CHECK(std::isnan(fp8_decode(0x7f, Fp8Format::e4m3)));
  CHECK(std::isinf(fp8_decode(0x7c, Fp8Format::e5m2)));
}

TEST_CASE("fp8 rounding is nearest-even with saturation, as the hardware's", "[fp8]") {
  // Ties: 1 + 1/16 lies halfway between 1 (mantissa 000) and 1.125 (001) in e4m3.
  CHECK(fp8_decode(fp8_encode(1.0625f, Fp8Format::e4m3), Fp8Format::e4m3) == 1.0f);
  CHECK(fp8_decode(fp8_encode(1.1875f, Fp8Format::e4m3), Fp8Format::e4m3) == 1.25f);
  // Saturation, infinities included; NaN stays NaN.
  CHECK(fp8_encode(1000.0f, Fp8Format::e4m3) == 0x7e);
  CHECK(fp8_encode(-1e30f, Fp8Format::e4m3) == 0xfe);
  CHECK(fp8_encode(INFINITY, Fp8Format::e5m2) == 0x7b);
  CHECK(fp8_encode(NAN, Fp8Format::e4m3) == 0x7f);
  // Subnormal ties: 2^-10 is halfway between 0 and 2^-9; 3 * 2^-10 between 2^-9 and 2^-8.
  CHECK(fp8_encode(std::ldexp(1.0f, -10), Fp8Format::e4m3) == 0x00);
  CHECK(fp8_encode(3 * std::ldexp(1.0f, -10), Fp8Format::e4m3) == 0x02);
  // Every rounding against the nearest-value search, across all the binades.
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exp(-20, 18);
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2})
    for (int i = 0; i < 200000; ++i) {
      const float v = std::ldexp(mant(gen), exp(gen));
      INFO(kernels::fp8_format_name(f) << " " << v);
      REQUIRE(fp8_encode(v, f) == nearest_code(v, f));
    }
}

TEST_CASE("fp8 scales map the amax onto the largest value", "[fp8]") {
  CHECK(kernels::fp8_scale_for_amax(2.0f, Fp8Format::e4m3) == 224.0f);
  CHECK(kernels::fp8_scale_for_amax(0.0f, Fp8Format::e4m3) == 1.0f);
  CHECK(kernels::fp8_scale_for_amax(INFINITY, Fp8Format::e5m2) == 1.0f);
  CHECK(kernels::fp8_scale_for_amax(NAN, Fp8Format::e5m2) == 1.0f);
  CHECK(kernels::fp8_scale_for_amax(1e-40f, Fp8Format::e4m3) == 1.0f);  // would overflow
}

TEST_CASE("fp8 quantization on the CPU: amax, scale, both layouts", "[fp8]") {
  Context ctx(Device::cpu());
  const Tensor x = testing::random_tensor(ctx, Shape{48, 80}, DType::f32, 3);  // (R, C)
  const Tensor amax = ctx.empty(Shape{1}, DType::f32);
  ops::fp8_amax(ctx, amax, x);
  const std::vector<double> xv = testing::values(ctx, x);
  double want = 0;
  for (double v : xv) want = std::max(want, std::fabs(v));
  CHECK(testing::values(ctx, amax)[0] == float(want));
  const ops::Fp8Quantized q = ops::fp8_quantize(ctx, x, amax, Fp8Format::e4m3, true, true);
  const float scale = 448.0f / float(want);
  CHECK(testing::values(ctx, q.rows.scale_inv)[0] == 1.0f / scale);
  const auto* rows = static_cast<const uint8_t*>(q.rows.data.data_ptr());
  const auto* cols = static_cast<const uint8_t*>(q.columns.data.data_ptr());
  for (int64_t r = 0; r < 48; ++r)
    for (int64_t c = 0; c < 80; ++c) {
      const uint8_t code = fp8_encode(float(xv[size_t(r * 80 + c)]) * scale, Fp8Format::e4m3);
      REQUIRE(rows[r * 80 + c] == code);
      REQUIRE(cols[c * 48 + r] == code);
    }
  // The quantization error is within half a step of e4m3 (2^-4 relative) of the amax.
  double worst = 0;
  for (int64_t i = 0; i < 48 * 80; ++i)
    worst = std::max(worst, std::fabs(fp8_decode(rows[i], Fp8Format::e4m3) / scale - xv[size_t(i)]));
  CHECK(worst <= want / 16);
}

TEST_CASE("fp8 matmul on the CPU is the product of the decoded operands", "[fp8]") {
  Context ctx(Device::cpu());
  const int64_t m = 32, n = 48, k = 64;
  const Tensor a = testing::random_tensor(ctx, Shape{m, k}, DType::f64, 7);
  const Tensor b = testing::random_tensor(ctx, Shape{n, k}, DType::f64, 8);
  auto quantize = [&](const Tensor& t, Fp8Format f) {
    const Tensor amax = ctx.empty(Shape{1}, DType::f32);
    ops::fp8_amax(ctx, amax, t);
    return ops::fp8_quantize(ctx, t, amax, f, true, false).rows;
  };
  const ops::Fp8Matrix qa = quantize(a, Fp8Format::e5m2), qb = quantize(b, Fp8Format::e4m3);
  const Tensor bias = testing::random_tensor(ctx, Shape{n}, DType::f64, 9);
  const Tensor out = testing::random_tensor(ctx, Shape{m, n}, DType::f64, 10);
  const std::vector<double> out0 = testing::values(ctx, out), bv = testing::values(ctx, bias);
  ops::fp8_matmul(ctx, out, qa, qb, 0.5, 1.0, bias);
  const float sa = float(testing::values(ctx, qa.scale_inv)[0]);
  const float sb = float(testing::values(ctx, qb.scale_inv)[0]);
  const double alpha = double(0.5f * (sa * sb));
  const auto* pa = static_cast<const uint8_t*>(qa.data.data_ptr());
  const auto* pb = static_cast<const uint8_t*>(qb.data.data_ptr());
  const std::vector<double> got = testing::values(ctx, out);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l)
        s += double(fp8_decode(pa[i * k + l], Fp8Format::e5m2)) * fp8_decode(pb[j * k + l], Fp8Format::e4m3);
      const double want = alpha * s + out0[size_t(i * n + j)] + bv[size_t(j)];
      REQUIRE(std::fabs(got[size_t(i * n + j)] - want) <= 1e-12 * (1 + std::fabs(want)));
    }
  // e5m2 x e5m2 has no tensor-core kernel: refused.
  const ops::Fp8Matrix qb2 = quantize(b, Fp8Format::e5m2);
  CHECK_THROWS_AS(ops::fp8_matmul(ctx, out, qa, qb2), DTypeError);
}

TEST_CASE("fp8 quantization records the amax for delayed scaling", "[fp8]") {
  Context ctx(Device::cpu());
  const Tensor x = testing::random_tensor(ctx, Shape{16, 32}, DType::f32, 5);  // (R, C)
  double want = 0;
  for (double v : testing::values(ctx, x)) want = std::max(want, std::fabs(v));
  const Tensor amax = ops::full(ctx, Shape{1}, DType::f32, 0.25);  // an earlier step's
  const Tensor record = ops::zeros(ctx, Shape{1}, DType::f32);
  const ops::Fp8Quantized q = ops::fp8_quantize(ctx, x, amax, Fp8Format::e4m3, true, false, Tensor(), record);
  CHECK(testing::values(ctx, record)[0] == float(want));
  // Scaled by the given amax, not the recorded one: values above 0.25 saturate.
  CHECK(testing::values(ctx, q.rows.scale_inv)[0] == 0.25f / 448.0f);
  // A larger amax already recorded (an earlier micro-batch) stays.
  ops::fill(ctx, record, 1e3);
  (void)ops::fp8_quantize(ctx, x, amax, Fp8Format::e4m3, true, false, Tensor(), record);
  CHECK(testing::values(ctx, record)[0] == 1e3);
}

TEST_CASE("fp8 amax histories: newest first, most_recent or max, margin", "[fp8]") {
  Context ctx(Device::cpu());
  // Two layers, histories of 3 steps, entry 0 the newest.
  const Tensor history = ops::from_host<float>(
      ctx, {1, 2, 3, 4, 5, 6, 7, 8, 9,  10, 20, 30, 40, 50, 60, 70, 80, 90}, Shape{2, 3, 3});
  const Tensor step = ops::from_host<float>(ctx, {0.5f, 100, 6, 1, 2, 3}, Shape{2, 3});
  const Tensor scale_amax = ops::zeros(ctx, Shape{2, 3}, DType::f32);
  ops::fp8_update_amax_histories(ctx, history, step, scale_amax, true, false, 1.0f);
  // The step's amax became entry 0; the oldest entry dropped out.
  CHECK(testing::values(ctx, history) ==
        std::vector<double>{0.5, 100, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3, 10, 20, 30, 40, 50, 60});
  CHECK(testing::values(ctx, scale_amax) == std::vector<double>{0.5, 100, 6, 1, 2, 3});
  // "max" over the history, with a margin of 2^2; a load's update leaves the history.
  ops::fp8_update_amax_histories(ctx, history, step, scale_amax, false, true, 4.0f);
  CHECK(testing::values(ctx, history)[0] == 0.5);
  CHECK(testing::values(ctx, scale_amax) == std::vector<double>{16, 400, 24, 160, 200, 240});
}

// ---- block scaling (the blockwise recipe)

namespace {

using kernels::Fp8Granularity;

// The scalar reference of one block: each element's code fp8_encode(x * scale), scale from
// the block's amax, and the block's inverse scale.
struct BlockRef {
  std::vector<uint8_t> codes;  // in the block's element order
  float scale_inv = 0;
};

BlockRef reference_block(const std::vector<double>& x, int64_t cols, int64_t r0, int64_t r1,
                         int64_t c0, int64_t c1, Fp8Format f) {
  float amax = 0;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(float(x[size_t(r * cols + c)])));
  const float scale = f == Fp8Format::e4m3 ? 448.0f / amax : 57344.0f / amax;
  BlockRef b;
  b.scale_inv = 1.0f / scale;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) b.codes.push_back(fp8_encode(float(x[size_t(r * cols + c)]) * scale, f));
  return b;
}

}  // namespace

TEST_CASE("fp8 1x128 block quantization on the CPU: per-row and per-column blocks", "[fp8]") {
  Context ctx(Device::cpu());
  // Partial blocks along both sizes, and grids with padding (130 and 301 rounded up to
  // multiples of 4: 132 and 304).
  const int64_t R = 130, C = 301;
  const Tensor x = testing::random_tensor(ctx, Shape{R, C}, DType::f32, 21);  // (R, C)
  const std::vector<double> xv = testing::values(ctx, x);
  const Tensor db = ops::zeros(ctx, Shape{C}, DType::f32);
  const ops::Fp8Quantized q =
      ops::fp8_quantize_blocks(ctx, x, Fp8Format::e4m3, Fp8Granularity::block_1x128, true, true, db);
  // The grids: rows (ceil(301 / 128), pad4(130)) = (3, 132); columns (ceil(130 / 128),
  // pad4(301)) = (2, 304).
  REQUIRE(q.rows.scale_inv.shape() == Shape{3, 132});
  REQUIRE(q.columns.scale_inv.shape() == Shape{2, 304});
  CHECK(q.rows.granularity == Fp8Granularity::block_1x128);
  const auto* rows = static_cast<const uint8_t*>(q.rows.data.data_ptr());
  const auto* cols = static_cast<const uint8_t*>(q.columns.data.data_ptr());
  const std::vector<double> rs = testing::values(ctx, q.rows.scale_inv);
  const std::vector<double> cs = testing::values(ctx, q.columns.scale_inv);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t kb = 0; kb < 3; ++kb) {  // 128 columns of row r
      const int64_t c0 = kb * 128, c1 = std::min(C, c0 + 128);
      const BlockRef b = reference_block(xv, C, r, r + 1, c0, c1, Fp8Format::e4m3);
      INFO("row " << r << " block " << kb);
      REQUIRE(rs[size_t(kb * 132 + r)] == b.scale_inv);
      for (int64_t c = c0; c < c1; ++c) REQUIRE(rows[r * C + c] == b.codes[size_t(c - c0)]);
    }
  for (int64_t c = 0; c < C; ++c)
    for (int64_t kb = 0; kb < 2; ++kb) {  // 128 rows of column c
      const int64_t r0 = kb * 128, r1 = std::min(R, r0 + 128);
      const BlockRef b = reference_block(xv, C, r0, r1, c, c + 1, Fp8Format::e4m3);
      INFO("column " << c << " block " << kb);
      REQUIRE(cs[size_t(kb * 304 + c)] == b.scale_inv);
      for (int64_t r = r0; r < r1; ++r) REQUIRE(cols[c * R + r] == b.codes[size_t(r - r0)]);
    }
  // The padding holds 1s.
  for (int64_t kb = 0; kb < 3; ++kb)
    for (int64_t r = R; r < 132; ++r) CHECK(rs[size_t(kb * 132 + r)] == 1.0);
  for (int64_t c = C; c < 304; ++c) CHECK(cs[size_t(c)] == 1.0);
  // Finer blocks than one tensor scale: every element within half a step of e4m3 (2^-4
  // relative) of its own block's amax, which is at most the tensor's.
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const double got = fp8_decode(rows[r * C + c], Fp8Format::e4m3) * rs[size_t((c / 128) * 132 + r)];
      const double block_amax = rs[size_t((c / 128) * 132 + r)] * 448.0;
      REQUIRE(std::fabs(got - xv[size_t(r * C + c)]) <= block_amax / 16);
    }
  // The bias gradient's sums beside the quantization.
  const std::vector<double> sums = testing::values(ctx, db);
  for (int64_t c = 0; c < C; ++c) {
    double want = 0;
    for (int64_t r = 0; r < R; ++r) want += xv[size_t(r * C + c)];
    REQUIRE(std::fabs(sums[size_t(c)] - want) <= 1e-5 * (1 + std::fabs(want)));
  }
}

TEST_CASE("fp8 128x128 block quantization on the CPU: one block set for both layouts", "[fp8]") {
  Context ctx(Device::cpu());
  const int64_t R = 300, C = 200;  // (3, 2) blocks, partial along both sizes
  const Tensor w = testing::random_tensor(ctx, Shape{R, C}, DType::f64, 22);  // (out, in)
  const std::vector<double> wv = testing::values(ctx, w);
  const ops::Fp8Quantized q = ops::fp8_quantize_blocks(ctx, w, Fp8Format::e5m2,
                                                       Fp8Granularity::block_128x128, true, true);
  // Grids: rows (ceil(300 / 128), pad4(ceil(200 / 128))) = (3, 4); columns (2, pad4(3)) = (2, 4).
  REQUIRE(q.rows.scale_inv.shape() == Shape{3, 4});
  REQUIRE(q.columns.scale_inv.shape() == Shape{2, 4});
  const auto* rows = static_cast<const uint8_t*>(q.rows.data.data_ptr());
  const auto* cols = static_cast<const uint8_t*>(q.columns.data.data_ptr());
  const std::vector<double> rs = testing::values(ctx, q.rows.scale_inv);
  const std::vector<double> cs = testing::values(ctx, q.columns.scale_inv);
  for (int64_t rb = 0; rb < 3; ++rb)
    for (int64_t cb = 0; cb < 2; ++cb) {
      const int64_t r0 = rb * 128, r1 = std::min(R, r0 + 128), c0 = cb * 128, c1 = std::min(C, c0 + 128);
      const BlockRef b = reference_block(wv, C, r0, r1, c0, c1, Fp8Format::e5m2);
      INFO("block " << rb << ", " << cb);
      REQUIRE(rs[size_t(rb * 4 + cb)] == b.scale_inv);
      REQUIRE(cs[size_t(cb * 4 + rb)] == b.scale_inv);  // the grid transposed
      size_t i = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c, ++i) {
          REQUIRE(rows[r * C + c] == b.codes[i]);
          REQUIRE(cols[c * R + r] == b.codes[i]);  // the same bytes transposed
        }
    }
  CHECK(rs[2] == 1.0);  // padding
  CHECK(cs[3] == 1.0);
}

TEST_CASE("fp8 block-scaled matmul on the CPU is the product of the dequantized blocks", "[fp8]") {
  Context ctx(Device::cpu());
  const int64_t m = 64, n = 160, k = 256;
  const Tensor a = testing::random_tensor(ctx, Shape{m, k}, DType::f64, 23);  // (M, K)
  const Tensor b = testing::random_tensor(ctx, Shape{n, k}, DType::f64, 24);  // (N, K)
  const ops::Fp8Matrix qa =
      ops::fp8_quantize_blocks(ctx, a, Fp8Format::e5m2, Fp8Granularity::block_1x128, true, false).rows;
  const ops::Fp8Matrix qb =
      ops::fp8_quantize_blocks(ctx, b, Fp8Format::e4m3, Fp8Granularity::block_128x128, true, false).rows;
  const Tensor bias = testing::random_tensor(ctx, Shape{n}, DType::f64, 25);
  const Tensor out = testing::random_tensor(ctx, Shape{m, n}, DType::f64, 26);
  const std::vector<double> out0 = testing::values(ctx, out), bv = testing::values(ctx, bias);
  ops::fp8_matmul(ctx, out, qa, qb, 0.5, 1.0, bias);
  const std::vector<double> sa = testing::values(ctx, qa.scale_inv), sb = testing::values(ctx, qb.scale_inv);
  const auto* pa = static_cast<const uint8_t*>(qa.data.data_ptr());
  const auto* pb = static_cast<const uint8_t*>(qb.data.data_ptr());
  const std::vector<double> got = testing::values(ctx, out), av = testing::values(ctx, a);
  double worst_vs_exact = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, exact = 0;
      for (int64_t l = 0; l < k; ++l) {
        // a: 1x128 grid (K / 128, pad4(M)); b: 128x128 grid (ceil(N / 128), pad4(K / 128)).
        const double x = fp8_decode(pa[i * k + l], Fp8Format::e5m2) * sa[size_t((l / 128) * m + i)];
        const double y = fp8_decode(pb[j * k + l], Fp8Format::e4m3) * sb[size_t((j / 128) * 4 + l / 128)];
        s += x * y;
        exact += av[size_t(i * k + l)] * y;
      }
      const double want = 0.5 * s + out0[size_t(i * n + j)] + bv[size_t(j)];
      REQUIRE(std::fabs(got[size_t(i * n + j)] - want) <= 1e-12 * (1 + std::fabs(want)));
      worst_vs_exact = std::max(worst_vs_exact, std::fabs(0.5 * (s - exact)));
    }
  // The quantization of a is really applied (e5m2: 2 mantissa bits), and bounded by it.
  CHECK(worst_vs_exact > 0);
  CHECK(worst_vs_exact < 0.5 * k * 0.125);
  // What cuBLASLt does not offer is refused on every device alike.
  const ops::Fp8Matrix qb_rows128 =
      ops::fp8_quantize_blocks(ctx, a, Fp8Format::e4m3, Fp8Granularity::block_128x128, true, false).rows;
  CHECK_THROWS_AS(ops::fp8_matmul(ctx, ctx.empty(Shape{m, m}, DType::f64), qb_rows128, qb_rows128),
                  ValueError);  // 128x128 x 128x128
  const Tensor amax = ops::full(ctx, Shape{1}, DType::f32, 1.0);
  const ops::Fp8Matrix tensorwise = ops::fp8_quantize(ctx, b, amax, Fp8Format::e4m3, true, false).rows;
  CHECK_THROWS_AS(ops::fp8_matmul(ctx, out, qa, tensorwise), ValueError);  // mixed scalings
  CHECK_THROWS_AS(ops::fp8_matmul(ctx, out, qa, qb, 1.0, 0.0, Tensor(), ops::Epilogue::None,
                                  Tensor(), /*fast_accum=*/true),
                  ValueError);
  const Tensor a96 = testing::random_tensor(ctx, Shape{m, 96}, DType::f64, 27);
  const Tensor b96 = testing::random_tensor(ctx, Shape{n, 96}, DType::f64, 28);
  CHECK_THROWS_AS(
      ops::fp8_matmul(ctx, out,
                      ops::fp8_quantize_blocks(ctx, a96, Fp8Format::e4m3, Fp8Granularity::block_1x128, true, false).rows,
                      ops::fp8_quantize_blocks(ctx, b96, Fp8Format::e4m3, Fp8Granularity::block_1x128, true, false).rows),
      ShapeError);  // K not a multiple of 128
}

TEST_CASE("fp8 row-wise quantization on the CPU: each row and each column by its own amax", "[fp8]") {
  Context ctx(Device::cpu());
  const int64_t R = 70, C = 45;  // grids padded: pad4(70) = 72, pad4(45) = 48
  Tensor x = testing::random_tensor(ctx, Shape{R, C}, DType::f32, 31);  // (R, C)
  ops::fill(ctx, x.narrow(0, 5, 1), 0.0);  // an all-zero row: scale 1
  const std::vector<double> xv = testing::values(ctx, x);
  const Tensor row_amax = ctx.empty(Shape{R}, DType::f32), column_amax = ctx.empty(Shape{C}, DType::f32);
  ops::fp8_row_amax(ctx, row_amax, x);
  ops::fp8_column_amax(ctx, column_amax, x);
  const std::vector<double> ra = testing::values(ctx, row_amax), ca = testing::values(ctx, column_amax);
  for (int64_t r = 0; r < R; ++r) {
    float m = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, std::fabs(float(xv[size_t(r * C + c)])));
    REQUIRE(ra[size_t(r)] == m);
  }
  for (int64_t c = 0; c < C; ++c) {
    float m = 0;
    for (int64_t r = 0; r < R; ++r) m = std::max(m, std::fabs(float(xv[size_t(r * C + c)])));
    REQUIRE(ca[size_t(c)] == m);
  }
  const Tensor db = ops::zeros(ctx, Shape{C}, DType::f32);
  const ops::Fp8Quantized q =
      ops::fp8_quantize_rowwise(ctx, x, Fp8Format::e4m3, row_amax, column_amax, db);
  REQUIRE(q.rows.scale_inv.shape() == Shape{1, 72});
  REQUIRE(q.columns.scale_inv.shape() == Shape{1, 48});
  CHECK(q.rows.granularity == Fp8Granularity::row);
  CHECK(q.columns.granularity == Fp8Granularity::row);
  const auto* rows = static_cast<const uint8_t*>(q.rows.data.data_ptr());
  const auto* cols = static_cast<const uint8_t*>(q.columns.data.data_ptr());
  const std::vector<double> rs = testing::values(ctx, q.rows.scale_inv);
  const std::vector<double> cs = testing::values(ctx, q.columns.scale_inv);
  for (int64_t r = 0; r < R; ++r) {
    INFO("row " << r);
    if (r == 5) {  // nothing to scale by: scale 1, zeros
      REQUIRE(rs[size_t(r)] == 1.0);
      for (int64_t c = 0; c < C; ++c) REQUIRE(rows[r * C + c] == 0);
      continue;
    }
    const BlockRef b = reference_block(xv, C, r, r + 1, 0, C, Fp8Format::e4m3);
    REQUIRE(rs[size_t(r)] == b.scale_inv);
    for (int64_t c = 0; c < C; ++c) REQUIRE(rows[r * C + c] == b.codes[size_t(c)]);
  }
  for (int64_t c = 0; c < C; ++c) {
    INFO("column " << c);
    const BlockRef b = reference_block(xv, C, 0, R, c, c + 1, Fp8Format::e4m3);
    REQUIRE(cs[size_t(c)] == b.scale_inv);
    for (int64_t r = 0; r < R; ++r) REQUIRE(cols[c * R + r] == b.codes[size_t(r)]);
  }
  for (int64_t r = R; r < 72; ++r) CHECK(rs[size_t(r)] == 1.0);  // padding
  for (int64_t c = C; c < 48; ++c) CHECK(cs[size_t(c)] == 1.0);
  const std::vector<double> sums = testing::values(ctx, db);
  for (int64_t c = 0; c < C; ++c) {
    double want = 0;
    for (int64_t r = 0; r < R; ++r) want += xv[size_t(r * C + c)];
    REQUIRE(std::fabs(sums[size_t(c)] - want) <= 1e-5 * (1 + std::fabs(want)));
  }
  // One layout alone.
  const ops::Fp8Quantized only_rows = ops::fp8_quantize_rowwise(ctx, x, Fp8Format::e4m3, row_amax, Tensor());
  CHECK(only_rows.rows.defined());
  CHECK_FALSE(only_rows.columns.defined());
  CHECK(std::memcmp(only_rows.rows.data.data_ptr(), rows, size_t(R * C)) == 0);
  CHECK_THROWS_AS(ops::fp8_quantize_rowwise(ctx, x, Fp8Format::e4m3, column_amax, Tensor()), ShapeError);
}

TEST_CASE("fp8 row-scaled matmul on the CPU is the product of the dequantized rows", "[fp8]") {
  Context ctx(Device::cpu());
  const int64_t m = 48, n = 32, k = 80;  // K a multiple of 16, not of 128
  const Tensor a = testing::random_tensor(ctx, Shape{m, k}, DType::f64, 32);  // (M, K)
  const Tensor b = testing::random_tensor(ctx, Shape{n, k}, DType::f64, 33);  // (N, K)
  auto rowwise = [&](const Tensor& t, Fp8Format f) {
    const Tensor amax = ctx.empty(Shape{t.size(0)}, DType::f32);
    ops::fp8_row_amax(ctx, amax, t);
    return ops::fp8_quantize_rowwise(ctx, t, f, amax, Tensor()).rows;
  };
  const ops::Fp8Matrix qa = rowwise(a, Fp8Format::e5m2), qb = rowwise(b, Fp8Format::e4m3);
  const Tensor out = testing::random_tensor(ctx, Shape{m, n}, DType::f64, 34);
  const std::vector<double> out0 = testing::values(ctx, out);
  ops::fp8_matmul(ctx, out, qa, qb, 0.5, 1.0);
  const std::vector<double> sa = testing::values(ctx, qa.scale_inv), sb = testing::values(ctx, qb.scale_inv);
  const auto* pa = static_cast<const uint8_t*>(qa.data.data_ptr());
  const auto* pb = static_cast<const uint8_t*>(qb.data.data_ptr());
  const std::vector<double> got = testing::values(ctx, out);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t l = 0; l < k; ++l)
        s += fp8_decode(pa[i * k + l], Fp8Format::e5m2) * sa[size_t(i)] *
             fp8_decode(pb[j * k + l], Fp8Format::e4m3) * sb[size_t(j)];
      const double want = 0.5 * s + out0[size_t(i * n + j)];
      REQUIRE(std::fabs(got[size_t(i * n + j)] - want) <= 1e-12 * (1 + std::fabs(want)));
    }
  // A row-scaled operand takes a row-scaled partner, without fast accumulation.
  const Tensor a128 = testing::random_tensor(ctx, Shape{m, 128}, DType::f64, 35);
  const Tensor b128 = testing::random_tensor(ctx, Shape{n, 128}, DType::f64, 36);
  CHECK_THROWS_AS(
      ops::fp8_matmul(ctx, out, rowwise(a128, Fp8Format::e4m3),
                      ops::fp8_quantize_blocks(ctx, b128, Fp8Format::e4m3, Fp8Granularity::block_1x128, true, false).rows),
      ValueError);
  CHECK_THROWS_AS(ops::fp8_matmul(ctx, out, qa, qb, 1.0, 0.0, Tensor(), ops::Epilogue::None, Tensor(),
                                  /*fast_accum=*/true),
                  ValueError);
}
