#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/core/dtype.h"
#include "runtime/core/error.h"
#include "tests/test_support.h"

using namespace fsdp;

TEST_CASE("dtype sizes and names round-trip", "[core][dtype]") {
  const DType all[] = {DType::f32, DType::bf16, DType::f16, DType::f64,    DType::i64,
                       DType::i32, DType::u16,  DType::u8,  DType::f8e4m3, DType::f8e5m2};
  const size_t sizes[] = {4, 2, 2, 8, 8, 4, 2, 1, 1, 1};
  static_assert(sizeof(all) / sizeof(all[0]) == kNumDTypes, "every dtype listed");
  for (int i = 0; i < kNumDTypes; ++i) {
    CHECK(dtype_size(all[i]) == sizes[i]);
    CHECK(dtype_from_name(dtype_name(all[i])) == all[i]);
  }
  CHECK(dtype_from_name("bfloat16") == DType::bf16);
  CHECK(dtype_from_name("FP32") == DType::f32);
  CHECK(dtype_from_name("float8_e4m3fn") == DType::f8e4m3);
  CHECK(dtype_from_name("E5M2") == DType::f8e5m2);
  CHECK_THROWS_AS(dtype_from_name("float8"), DTypeError);
  // FP8 is storage, not a compute type.
  CHECK(is_fp8(DType::f8e4m3));
  CHECK(is_fp8(DType::f8e5m2));
  CHECK_FALSE(is_floating(DType::f8e4m3));
  CHECK_FALSE(is_fp8(DType::bf16));
}

TEST_CASE("bf16 rounds to nearest even", "[core][dtype]") {
  // 1.0 + 2^-8 lies exactly halfway between bf16 1.0 and 1.0 + 2^-7: ties go to even (1.0).
  CHECK(float(bf16(1.0f + 1.0f / 256)) == 1.0f);
  // 1.0 + 3 * 2^-8 lies halfway between 1+2^-7 (odd mantissa) and 1+2^-6: rounds up to even.
  CHECK(float(bf16(1.0f + 3.0f / 256)) == 1.0f + 1.0f / 64);
  // Just above the halfway point rounds up.
  CHECK(float(bf16(std::nextafter(1.0f + 1.0f / 256, 2.0f))) == 1.0f + 1.0f / 128);
  // Exactly representable values are unchanged, signs kept.
  for (float v : {0.0f, -0.0f, 1.0f, -2.5f, 3.140625f, 65536.0f, 1e-30f}) {
    const float r = float(bf16(v));
    CHECK(float(bf16(r)) == r);
  }
  CHECK(std::signbit(float(bf16(-0.0f))));
  CHECK(std::isinf(float(bf16(std::numeric_limits<float>::infinity()))));
  CHECK(std::isnan(float(bf16(std::numeric_limits<float>::quiet_NaN()))));
  // The largest float rounds to infinity in bf16 (it is past bf16's max + half an ulp).
  CHECK(std::isinf(float(bf16(std::numeric_limits<float>::max()))));
  // Exhaustive: every bf16 bit pattern survives float and back.
  for (uint32_t b = 0; b < 65536; ++b) {
    const bf16 h = bf16::from_bits(uint16_t(b));
    const float f = float(h);
    if (std::isnan(f)) continue;
    REQUIRE(bf16(f).bits == h.bits);
  }
}

TEST_CASE("f16 conversion is exact, rounds to nearest even, handles subnormals", "[core][dtype]") {
  CHECK(float(f16(1.0f)) == 1.0f);
  CHECK(float(f16(65504.0f)) == 65504.0f);
  CHECK(std::isinf(float(f16(65520.0f))));  // halfway to the next binade rounds to inf
  CHECK(float(f16(65519.0f)) == 65504.0f);
  CHECK(float(f16(std::ldexp(1.0f, -24))) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(float(f16(std::ldexp(1.0f, -25))) == 0.0f);                   // ties to even: 0
  CHECK(float(f16(std::ldexp(3.0f, -26))) == std::ldexp(1.0f, -24));  // 0.75 ulp rounds up
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1).
  CHECK(float(f16(1.0f + std::ldexp(1.0f, -11))) == 1.0f);
  for (uint32_t b = 0; b < 65536; ++b) {
    const f16 h = f16::from_bits(uint16_t(b));
    const float f = float(h);
    if (std::isnan(f)) continue;
    REQUIRE(f16(f).bits == h.bits);
  }
}

TEST_CASE("dispatch_dtype maps each dtype to its C++ type", "[core][dtype]") {
  CHECK(dispatch_dtype(DType::bf16, [](auto t) { return dtype_of<decltype(t)>(); }) == DType::bf16);
  CHECK(dispatch_dtype(DType::u16, [](auto t) { return sizeof(t); }) == 2);
  CHECK(dispatch_dtype(DType::i64, [](auto t) { return dtype_of<decltype(t)>(); }) == DType::i64);
}

TEST_CASE("dispatch_dtype maps the FP8 dtypes to their byte types", "[core][dtype][fp8]") {
  CHECK(dispatch_dtype(DType::f8e4m3, [](auto t) { return dtype_of<decltype(t)>(); }) == DType::f8e4m3);
  CHECK(dispatch_dtype(DType::f8e5m2, [](auto t) { return sizeof(t); }) == 1);
}

namespace {

// The FP8 byte nearest to v by search over every finite byte, ties to the even byte
// (the even mantissa), saturating past the largest finite value; NaN to 0x7f: an
// independent statement of what float -> FP8 with cvt.rn.satfinite gives.
template <typename F8>
uint8_t nearest_fp8(float v) {
  if (std::isnan(v)) return 0x7f;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const double a = std::min(std::fabs(double(v)), double(F8::kMax));  // saturation
  uint8_t best = 0;
  double best_d = INFINITY;
  for (int b = 0; b < 0x80; ++b) {
    const float f = F8::to_float(uint8_t(b));
    if (!std::isfinite(f)) continue;
    const double d = std::fabs(double(f) - a);
    if (d < best_d || (d == best_d && (b & 1) == 0)) {
      best = uint8_t(b);
      best_d = d;
    }
  }
  return uint8_t(sign | best);
}

// v as an f32 of those bits.
float from_bits32(uint32_t u) { return bits_float(u); }

}  // namespace

TEST_CASE("f8e4m3: known values, ties to even, subnormals, saturation, NaN", "[core][dtype][fp8]") {
  CHECK(f8e4m3::from_float(1.0f) == 0x38);  // exponent 7 (bias 7), mantissa 0
  CHECK(f8e4m3::from_float(-1.0f) == 0xb8);
  CHECK(f8e4m3::from_float(448.0f) == 0x7e);  // the largest finite value
  CHECK(f8e4m3::to_float(0x7e) == 448.0f);
  CHECK(f8e4m3::from_float(240.0f) == 0x77);  // 1.875 * 2^7
  CHECK(f8e4m3::from_float(1.0f + 1.0f / 16) == 0x38);   // halfway 1 / 1.125: even (1)
  CHECK(f8e4m3::from_float(1.0f + 3.0f / 16) == 0x3a);   // halfway 1.125 / 1.25: even (1.25)
  CHECK(f8e4m3::from_float(std::nextafter(1.0f + 1.0f / 16, 2.0f)) == 0x39);
  // Subnormals: m * 2^-9.
  CHECK(f8e4m3::from_float(std::ldexp(1.0f, -9)) == 0x01);
  CHECK(f8e4m3::from_float(std::ldexp(7.0f, -9)) == 0x07);  // the largest subnormal
  CHECK(f8e4m3::from_float(std::ldexp(1.0f, -6)) == 0x08);  // the smallest normal
  CHECK(f8e4m3::from_float(std::ldexp(1.0f, -10)) == 0x00);  // half the smallest: even (0)
  CHECK(f8e4m3::from_float(std::ldexp(3.0f, -11)) == 0x01);  // 0.75 of it rounds up
  CHECK(f8e4m3::from_float(-std::ldexp(1.0f, -11)) == 0x80);  // signed zero
  CHECK(f8e4m3::from_float(-0.0f) == 0x80);
  CHECK(f8e4m3::from_float(1e-40f) == 0x00);  // an f32 subnormal
  // Saturation: past 448 (464 is halfway to the 480 that would be NaN's byte), infinities.
  CHECK(f8e4m3::from_float(464.0f) == 0x7e);
  CHECK(f8e4m3::from_float(1e30f) == 0x7e);
  CHECK(f8e4m3::from_float(INFINITY) == 0x7e);
  CHECK(f8e4m3::from_float(-INFINITY) == 0xfe);
  CHECK(f8e4m3::from_float(std::numeric_limits<float>::max()) == 0x7e);
  // NaN: the canonical 0x7f whatever its sign and payload; 0x7f and 0xff read as NaN.
  CHECK(f8e4m3::from_float(NAN) == 0x7f);
  CHECK(f8e4m3::from_float(-NAN) == 0x7f);
  CHECK(f8e4m3::from_float(from_bits32(0xffc00001u)) == 0x7f);
  CHECK(std::isnan(f8e4m3::to_float(0x7f)));
  CHECK(std::isnan(f8e4m3::to_float(0xff)));
  CHECK(float(f8e4m3(2.5f)) == 2.5f);
}

TEST_CASE("f8e5m2: known values, ties to even, subnormals, saturation, infinities, NaN",
          "[core][dtype][fp8]") {
  CHECK(f8e5m2::from_float(1.0f) == 0x3c);  // exponent 15 (bias 15), mantissa 0
  CHECK(f8e5m2::from_float(-2.0f) == 0xc0);
  CHECK(f8e5m2::from_float(57344.0f) == 0x7b);  // the largest finite value
  CHECK(f8e5m2::to_float(0x7b) == 57344.0f);
  CHECK(f8e5m2::from_float(1.0f + 1.0f / 8) == 0x3c);  // halfway 1 / 1.25: even (1)
  CHECK(f8e5m2::from_float(1.0f + 3.0f / 8) == 0x3e);  // halfway 1.25 / 1.5: even (1.5)
  CHECK(f8e5m2::from_float(std::ldexp(1.0f, -16)) == 0x01);  // the smallest subnormal
  CHECK(f8e5m2::from_float(std::ldexp(1.0f, -14)) == 0x04);  // the smallest normal
  CHECK(f8e5m2::from_float(std::ldexp(1.0f, -17)) == 0x00);  // halfway: even (0)
  CHECK(f8e5m2::from_float(std::ldexp(3.0f, -18)) == 0x01);
  // 61440 is halfway between 57344 (odd mantissa) and 65536 (infinity's byte): rounds up,
  // then saturates; so do infinities.
  CHECK(f8e5m2::from_float(61440.0f) == 0x7b);
  CHECK(f8e5m2::from_float(INFINITY) == 0x7b);
  CHECK(f8e5m2::from_float(-INFINITY) == 0xfb);
  CHECK(std::isinf(f8e5m2::to_float(0x7c)));
  CHECK(f8e5m2::to_float(0xfc) == -INFINITY);
  CHECK(f8e5m2::from_float(NAN) == 0x7f);
  for (int b : {0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff}) CHECK(std::isnan(f8e5m2::to_float(uint8_t(b))));
}

TEMPLATE_TEST_CASE("FP8 conversion: every byte round-trips and every bf16 value rounds to the nearest",
                   "[core][dtype][fp8]", f8e4m3, f8e5m2) {
  // Decoding is exact and increasing: each finite byte is its own value's conversion.
  float previous = -1;
  for (int b = 0; b < 0x80; ++b) {
    const float f = TestType::to_float(uint8_t(b));
    if (!std::isfinite(f)) continue;
    INFO("byte " << b);
    CHECK(f > previous);
    previous = f;
    CHECK(TestType::from_float(f) == b);
    CHECK(TestType::from_float(-f) == (b | 0x80));
    CHECK(TestType::to_float(uint8_t(b | 0x80)) == -f);
  }
  CHECK(previous == TestType::kMax);
  // Every bf16 value (every exponent, both signs, infinities, NaNs) against the search, and
  // the midpoints between consecutive FP8 values and their neighbours (the ties).
  for (uint32_t h = 0; h < 65536; ++h) {
    const float v = from_bits32(h << 16);
    INFO("bf16 bits " << h << " = " << v);
    REQUIRE(TestType::from_float(v) == nearest_fp8<TestType>(v));
  }
  for (int b = 0; b + 1 < 0x80; ++b) {
    const float lo = TestType::to_float(uint8_t(b)), hi = TestType::to_float(uint8_t(b + 1));
    if (!std::isfinite(hi)) break;
    const float mid = lo + (hi - lo) / 2;  // exact: FP8 values have few mantissa bits
    for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      INFO("near the midpoint of bytes " << b << " and " << b + 1 << ": " << v);
      REQUIRE(TestType::from_float(v) == nearest_fp8<TestType>(v));
    }
  }
}
