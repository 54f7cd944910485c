// FP8 on the CPU: the software rounding (kernels/fp8_format.h) against a brute-force
// nearest-value search over all 256 codes of each format, quantization's scale and layouts,
// and the FP8 matmul against the product of the decoded values.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/fp8_ops.h"
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
