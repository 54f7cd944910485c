// Element types and the host-side bf16/fp16/fp8 conversions.
//
// bf16 and fp16 are stored as raw 16-bit patterns (struct bf16 / struct f16); conversion
// from float rounds to nearest, ties to even, as the hardware does, and keeps NaN a NaN.
//
// The two FP8 formats of Hopper's tensor cores are stored as raw bytes (struct f8e4m3 /
// struct f8e5m2). They are storage formats: no compute kernel takes them (is_floating() is
// false for them; is_fp8() says what they are); the FP8 quantize kernels and the FP8 matmul
// do (kernels/nn_ops.h). Conversion from float rounds to nearest, ties to even, and
// saturates: values past the largest finite value (infinities included) become it, as the
// GPU's `cvt.rn.satfinite` does, and NaN becomes the one canonical NaN byte 0x7f.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace fsdp {

enum class DType : uint8_t { f32, bf16, f16, f64, i64, i32, u16, u8, f8e4m3, f8e5m2 };

constexpr int kNumDTypes = 10;

size_t dtype_size(DType t);
const char* dtype_name(DType t);          // "f32", "bf16", ...
DType dtype_from_name(const std::string& name);  // accepts "f32"/"float32"/"fp32", ...; throws DTypeError
bool is_floating(DType t);  // f32, bf16, f16, f64: the types kernels compute on
bool is_fp8(DType t);       // f8e4m3, f8e5m2: FP8 storage

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return bits_float(uint32_t(bits) << 16); }

  static uint16_t from_float(float f) {
    uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
    uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);                      // ties to even
    return uint16_t((u + rounding_bias) >> 16);
  }
  static bf16 from_bits(uint16_t b) {
    bf16 h;
    h.bits = b;
    return h;
  }
};

struct f16 {
  uint16_t bits = 0;
  f16() = default;
  explicit f16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }

  static uint16_t from_float(float f);
  static float to_float(uint16_t h);
  static f16 from_bits(uint16_t b) {
    f16 h;
    h.bits = b;
    return h;
  }
};

// FP8 E4M3 ("e4m3fn": 1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no infinities,
// NaN 0x7f/0xff; largest finite 448, smallest subnormal 2^-9): the forward's activations and
// weights.
struct f8e4m3 {
  uint8_t bits = 0;
  f8e4m3() = default;
  explicit f8e4m3(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }

  static constexpr float kMax = 448.0f;
  static uint8_t from_float(float f);  // round to nearest even, saturating, NaN -> 0x7f
  static float to_float(uint8_t b);    // exact
  static f8e4m3 from_bits(uint8_t b) {
    f8e4m3 h;
    h.bits = b;
    return h;
  }
};

// FP8 E5M2 (1 sign, 5 exponent bits of bias 15, 2 mantissa bits; infinities 0x7c/0xfc, NaN
// above them; largest finite 57344, smallest subnormal 2^-16): gradients, which need range
// more than precision ("hybrid" FP8).
struct f8e5m2 {
  uint8_t bits = 0;
  f8e5m2() = default;
  explicit f8e5m2(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }

  static constexpr float kMax = 57344.0f;
  static uint8_t from_float(float f);  // round to nearest even, saturating, NaN -> 0x7f
  static float to_float(uint8_t b);    // exact
  static f8e5m2 from_bits(uint8_t b) {
    f8e5m2 h;
    h.bits = b;
    return h;
  }
};

// The largest finite value of an FP8 dtype (448 or 57344); throws DTypeError for others.
float fp8_max(DType t);

// Maps a C++ element type to its DType: dtype_of<float>() == DType::f32.
template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<bf16>() { return DType::bf16; }
template <> constexpr DType dtype_of<f16>() { return DType::f16; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::u16; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::u8; }
template <> constexpr DType dtype_of<f8e4m3>() { return DType::f8e4m3; }
template <> constexpr DType dtype_of<f8e5m2>() { return DType::f8e5m2; }

// Host conversions between any element type and double (exact for every type but the
// 64-bit integers beyond 2^53).
template <typename T> inline double to_double(T v) { return static_cast<double>(v); }
template <> inline double to_double(bf16 v) { return static_cast<float>(v); }
template <> inline double to_double(f16 v) { return static_cast<float>(v); }
template <> inline double to_double(f8e4m3 v) { return static_cast<float>(v); }
template <> inline double to_double(f8e5m2 v) { return static_cast<float>(v); }
template <typename T> inline T from_double(double v) { return static_cast<T>(v); }
template <> inline bf16 from_double<bf16>(double v) { return bf16(static_cast<float>(v)); }
template <> inline f16 from_double<f16>(double v) { return f16(static_cast<float>(v)); }
// Through float, as the CUDA copy kernels convert (two roundings, like bf16's).
template <> inline f8e4m3 from_double<f8e4m3>(double v) { return f8e4m3(static_cast<float>(v)); }
template <> inline f8e5m2 from_double<f8e5m2>(double v) { return f8e5m2(static_cast<float>(v)); }

// Calls f(T{}) with the C++ type of a runtime DType: dispatch_dtype(t, [&](auto tag){...}).
template <typename F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::bf16: return f(bf16{});
    case DType::f16: return f(f16{});
    case DType::f64: return f(double{});
    case DType::i64: return f(int64_t{});
    case DType::i32: return f(int32_t{});
    case DType::u16: return f(uint16_t{});
    case DType::u8: return f(uint8_t{});
    case DType::f8e4m3: return f(f8e4m3{});
    case DType::f8e5m2: return f(f8e5m2{});
  }
  return f(float{});  // unreachable: every enumerator is handled above
}

}  // namespace fsdp
