#include <cmath>
#include <limits>

#include "runtime/core/dtype.h"
#include "runtime/core/error.h"
#include "tests/test_support.h"

using namespace fsdp;

TEST_CASE("dtype sizes and names round-trip", "[core][dtype]") {
  const DType all[] = {DType::f32, DType::bf16, DType::f16, DType::f64,
                       DType::i64, DType::i32,  DType::u16, DType::u8};
  const size_t sizes[] = {4, 2, 2, 8, 8, 4, 2, 1};
  for (int i = 0; i < kNumDTypes; ++i) {
    CHECK(dtype_size(all[i]) == sizes[i]);
    CHECK(dtype_from_name(dtype_name(all[i])) == all[i]);
  }
  CHECK(dtype_from_name("bfloat16") == DType::bf16);
  CHECK(dtype_from_name("FP32") == DType::f32);
  CHECK_THROWS_AS(dtype_from_name("float8"), DTypeError);
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
