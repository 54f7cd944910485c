// The CPU FP8 kernels (kernels/cpu/fp8.h through kernels/nn_ops.h): per-tensor scales and
// their guards, the cast to FP8 and its transpose, and the simulated FP8 matmul against a
// reference computed in f64 from the dequantized operands.
#include <cfloat>
#include <cmath>

#include "kernels/fp8_math.h"
#include "kernels/nn_ops.h"
#include "kernels/ops.h"
#include "kernels/scalar_math.h"
#include "tests/kernels/nn_test_util.h"
#include "tests/test_support.h"

using namespace fsdp;
using fsdp::testing::random_tensor;
using fsdp::testing::values;

namespace {

Tensor scales_of(Context& ctx, const Tensor& x, DType fp8) {
  Tensor s = ctx.empty(Shape{kernels::kFp8Scales}, DType::f32);
  ops::fp8_scales(ctx, s, x, fp8);
  return s;
}

float scale_value(const Tensor& scales, int at) { return scales.data<float>()[at]; }

// The decoded values of an FP8 tensor (host), unscaled.
std::vector<double> decoded(const Tensor& q) {
  std::vector<double> out(size_t(q.numel()));
  const uint8_t* b = static_cast<const uint8_t*>(q.data_ptr());
  for (int64_t i = 0; i < q.numel(); ++i)
    out[size_t(i)] = q.dtype() == DType::f8e4m3 ? f8e4m3::to_float(b[i]) : f8e5m2::to_float(b[i]);
  return out;
}

// x (R, C) quantized as stored and transposed.
struct Quantized {
  Tensor q, q_t, scales;
};
Quantized quantize(Context& ctx, const Tensor& x, DType fp8) {
  Quantized r{ctx.empty(x.shape(), fp8), ctx.empty(Shape{x.size(1), x.size(0)}, fp8),
              scales_of(ctx, x, fp8)};
  ops::fp8_quantize(ctx, r.q, r.q_t, x, r.scales);
  return r;
}

}  // namespace

TEST_CASE("fp8_scales: amax, scale = fp8 max / amax and its inverse, with the guards",
          "[kernels][fp8]") {
  Context ctx;
  // The largest magnitude is negative; a NaN does not count.
  const Tensor x = ops::from_vector(ctx, {0.5, -3.0, 2.0, NAN, 1.0}, Shape{5}, DType::f32);
  for (DType fp8 : {DType::f8e4m3, DType::f8e5m2}) {
    const Tensor s = scales_of(ctx, x, fp8);
    CHECK(scale_value(s, kernels::kFp8Amax) == 3.0f);
    CHECK(scale_value(s, kernels::kFp8Scale) == fp8_max(fp8) / 3.0f);
    CHECK(scale_value(s, kernels::kFp8ScaleInv) == 1.0f / (fp8_max(fp8) / 3.0f));
  }
  // An all-zero tensor, an infinity and an all-NaN tensor: scale 1.
  for (double v : {0.0, double(INFINITY), double(NAN)}) {
    INFO("value " << v);
    const Tensor s = scales_of(ctx, ops::from_vector(ctx, {v, 0.0}, Shape{2}, DType::f32),
                               DType::f8e4m3);
    CHECK(scale_value(s, kernels::kFp8Scale) == 1.0f);
    CHECK(scale_value(s, kernels::kFp8ScaleInv) == 1.0f);
  }
  // An amax so small that 448 / amax overflows: FLT_MAX, not infinity.
  const Tensor tiny = ops::from_vector(ctx, {1e-38}, Shape{1}, DType::f32);
  CHECK(scale_value(scales_of(ctx, tiny, DType::f8e4m3), kernels::kFp8Scale) == FLT_MAX);
  CHECK(kernels::fp8_scale_from_amax(2.0f, 448.0f) == 224.0f);
  CHECK_THROWS_AS(scales_of(ctx, x, DType::bf16), DTypeError);
}

TEST_CASE("fp8_quantize: the amax lands on the largest FP8 value, the transpose holds the "
          "same bytes, every byte is the cast of x * scale",
          "[kernels][fp8]") {
  Context ctx;
  const int64_t r = 37, c = 45;  // no multiple of anything
  for (DType in : {DType::f32, DType::f64}) {
    for (DType fp8 : {DType::f8e4m3, DType::f8e5m2}) {
      INFO(dtype_name(in) << " -> " << dtype_name(fp8));
      const Tensor x = random_tensor(ctx, Shape{r, c}, in, 3, -5, 5);
      const Quantized q = quantize(ctx, x, fp8);
      const float scale = scale_value(q.scales, kernels::kFp8Scale);
      const std::vector<double> xv = values(ctx, x), qv = decoded(q.q), tv = decoded(q.q_t);
      double largest = 0;
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = 0; j < c; ++j) {
          const size_t at = size_t(i * c + j);
          const float scaled = float(xv[at]) * scale;
          const double want = fp8 == DType::f8e4m3 ? f8e4m3::to_float(f8e4m3::from_float(scaled))
                                                   : f8e5m2::to_float(f8e5m2::from_float(scaled));
          REQUIRE(qv[at] == want);
          REQUIRE(tv[size_t(j * r + i)] == qv[at]);
          largest = std::max(largest, std::fabs(qv[at]));
        }
      CHECK(largest == fp8_max(fp8));
      // Dequantized, every value is within half an FP8 ulp of x: 2^-4 relative for e4m3's
      // 3 mantissa bits, 2^-3 for e5m2's 2 (normal range), or half the smallest subnormal.
      const double rel = fp8 == DType::f8e4m3 ? 1.0 / 16 : 1.0 / 8;
      const double sub = std::ldexp(1.0, fp8 == DType::f8e4m3 ? -10 : -17);
      const double inv = scale_value(q.scales, kernels::kFp8ScaleInv);
      for (size_t i = 0; i < xv.size(); ++i)
        REQUIRE(std::fabs(qv[i] * inv - xv[i]) <= std::max(rel * std::fabs(xv[i]), sub * inv) * 1.0001);
    }
  }
  // bf16 input: the bf16 value itself is scaled (what the GPU reads).
  const Tensor xb = ops::cast(ctx, random_tensor(ctx, Shape{16, 32}, DType::f32, 4), DType::bf16);
  const Quantized qb = quantize(ctx, xb, DType::f8e4m3);
  const Quantized qf = quantize(ctx, ops::cast(ctx, xb, DType::f32), DType::f8e4m3);
  CHECK(decoded(qb.q) == decoded(qf.q));
}

TEST_CASE("fp8_quantize writes either layout alone and refuses bad arguments", "[kernels][fp8]") {
  Context ctx;
  const Tensor x = random_tensor(ctx, Shape{16, 48}, DType::f32, 5);
  const Quantized both = quantize(ctx, x, DType::f8e4m3);
  const Tensor only = ctx.empty(Shape{16, 48}, DType::f8e4m3);
  const Tensor only_t = ctx.empty(Shape{48, 16}, DType::f8e4m3);
  ops::fp8_quantize(ctx, only, Tensor(), x, both.scales);
  ops::fp8_quantize(ctx, Tensor(), only_t, x, both.scales);
  CHECK(decoded(only) == decoded(both.q));
  CHECK(decoded(only_t) == decoded(both.q_t));
  CHECK_THROWS_AS(ops::fp8_quantize(ctx, Tensor(), Tensor(), x, both.scales), ValueError);
  CHECK_THROWS_AS(ops::fp8_quantize(ctx, ctx.empty(Shape{48, 16}, DType::f8e4m3), Tensor(), x,
                                    both.scales),
                  ShapeError);
  CHECK_THROWS_AS(ops::fp8_quantize(ctx, ctx.empty(Shape{16, 48}, DType::bf16), Tensor(), x,
                                    both.scales),
                  DTypeError);
}

TEST_CASE("fp8_matmul (CPU twin) equals the product of the dequantized operands in f64",
          "[kernels][fp8]") {
  Context ctx;
  // Forward (e4m3 x e4m3), dgrad and wgrad (e5m2 gradient x e4m3), as the FP8 linear layer
  // calls them, with beta and a bias.
  struct Case {
    int64_t m, n, k;
    DType a, b;
    double beta;
    bool bias;
  };
  for (const Case& cs : {Case{64, 48, 80, DType::f8e4m3, DType::f8e4m3, 0.0, true},
                         Case{64, 80, 48, DType::f8e5m2, DType::f8e4m3, 1.0, false},
                         Case{48, 80, 64, DType::f8e5m2, DType::f8e4m3, 1.0, false},
                         Case{32, 16, 272, DType::f8e4m3, DType::f8e5m2, 0.0, false}}) {
    INFO(cs.m << "x" << cs.n << "x" << cs.k << " " << dtype_name(cs.a) << " x " << dtype_name(cs.b));
    const Quantized a = quantize(ctx, random_tensor(ctx, Shape{cs.m, cs.k}, DType::f32, 6, -2, 2), cs.a);
    const Quantized b = quantize(ctx, random_tensor(ctx, Shape{cs.n, cs.k}, DType::f32, 7), cs.b);
    const Tensor out = random_tensor(ctx, Shape{cs.m, cs.n}, DType::f32, 8);
    const std::vector<double> out0 = values(ctx, out);
    const Tensor bias = cs.bias ? random_tensor(ctx, Shape{cs.n}, DType::f32, 9) : Tensor();
    ops::fp8_matmul(ctx, out, a.q, a.scales, b.q, b.scales, cs.beta, bias);
    const std::vector<double> av = decoded(a.q), bv = decoded(b.q), got = values(ctx, out);
    const double sa = scale_value(a.scales, kernels::kFp8ScaleInv),
                 sb = scale_value(b.scales, kernels::kFp8ScaleInv);
    const std::vector<double> bias_v = cs.bias ? values(ctx, bias) : std::vector<double>();
    double worst = 0, largest = 0;
    for (int64_t i = 0; i < cs.m; ++i)
      for (int64_t j = 0; j < cs.n; ++j) {
        double dot = 0;
        for (int64_t p = 0; p < cs.k; ++p)
          dot += av[size_t(i * cs.k + p)] * sa * bv[size_t(j * cs.k + p)] * sb;
        const size_t at = size_t(i * cs.n + j);
        const double want = dot + cs.beta * out0[at] + (cs.bias ? bias_v[size_t(j)] : 0.0);
        worst = std::max(worst, std::fabs(got[at] - want));
        largest = std::max(largest, std::fabs(want));
      }
    // The decoded products are exact in f32; their sums over K <= 272 round in f32:
    // K * 2^-24 of the largest partial sum at worst, ~2e-5 relative to the output's scale.
    CHECK(worst / largest < 2e-5);
  }
  // With the GELU epilogue: gelu of that product, the pre-activation in aux.
  const Quantized a = quantize(ctx, random_tensor(ctx, Shape{32, 64}, DType::f32, 10), DType::f8e4m3);
  const Quantized b = quantize(ctx, random_tensor(ctx, Shape{16, 64}, DType::f32, 11), DType::f8e4m3);
  const Tensor plain = ctx.empty(Shape{32, 16}, DType::f32), out = ctx.empty(Shape{32, 16}, DType::f32),
               pre = ctx.empty(Shape{32, 16}, DType::f32);
  ops::fp8_matmul(ctx, plain, a.q, a.scales, b.q, b.scales);
  ops::fp8_matmul(ctx, out, a.q, a.scales, b.q, b.scales, 0.0, Tensor(), ops::Epilogue::Gelu, pre);
  const std::vector<double> pv = values(ctx, plain), prev = values(ctx, pre), ov = values(ctx, out);
  CHECK(prev == pv);
  for (size_t i = 0; i < pv.size(); ++i) CHECK(ov[i] == Approx(kernels::gelu_tanh(pv[i])).epsilon(1e-6));
}

TEST_CASE("fp8_matmul refuses what FP8 tensor cores cannot multiply", "[kernels][fp8]") {
  Context ctx;
  auto q = [&](int64_t r, int64_t c, DType t) { return quantize(ctx, random_tensor(ctx, Shape{r, c}, DType::f32, 1), t); };
  const Quantized a = q(32, 64, DType::f8e4m3), b = q(16, 64, DType::f8e4m3), g = q(32, 64, DType::f8e5m2);
  const Tensor out = ctx.empty(Shape{32, 16}, DType::f32);
  // Not multiples of 16.
  const Quantized odd = q(30, 64, DType::f8e4m3);
  CHECK_THROWS_AS(ops::fp8_matmul(ctx, ctx.empty(Shape{30, 16}, DType::f32), odd.q, odd.scales, b.q, b.scales),
                  ShapeError);
  // Both operands e5m2.
  const Quantized g2 = q(16, 64, DType::f8e5m2);
  CHECK_THROWS_AS(ops::fp8_matmul(ctx, out, g.q, g.scales, g2.q, g2.scales), DTypeError);
  // K differs; a non-FP8 operand; an output of the wrong shape.
  const Quantized k2 = q(16, 32, DType::f8e4m3);
  CHECK_THROWS_AS(ops::fp8_matmul(ctx, out, a.q, a.scales, k2.q, k2.scales), ShapeError);
  CHECK_THROWS_AS(ops::fp8_matmul(ctx, out, random_tensor(ctx, Shape{32, 64}, DType::f32, 2), a.scales,
                                  b.q, b.scales),
                  DTypeError);
  CHECK_THROWS_AS(ops::fp8_matmul(ctx, ctx.empty(Shape{16, 32}, DType::f32), a.q, a.scales, b.q, b.scales),
                  ShapeError);
  // A GELU epilogue with beta.
  CHECK_THROWS_AS(ops::fp8_matmul(ctx, out, a.q, a.scales, b.q, b.scales, 1.0, Tensor(), ops::Epilogue::Gelu),
                  ValueError);
}

TEST_CASE("FP8 casts through ops::cast saturate like the quantize kernel", "[kernels][fp8]") {
  Context ctx;
  const Tensor x = ops::from_vector(ctx, {1.0, 500.0, -1e6, 0.01}, Shape{4}, DType::f32);
  const Tensor q = ops::cast(ctx, x, DType::f8e4m3);
  CHECK(values(ctx, q) == std::vector<double>{1.0, 448.0, -448.0, f8e4m3::to_float(f8e4m3::from_float(0.01f))});
  const Tensor q5 = ops::cast(ctx, x, DType::f8e5m2);
  CHECK(values(ctx, q5) == std::vector<double>{1.0, 512.0, -57344.0, f8e5m2::to_float(f8e5m2::from_float(0.01f))});
}
