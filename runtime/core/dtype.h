// Element types and the host-side bf16/fp16 conversions.
//
// bf16 and fp16 are stored as raw 16-bit patterns (struct bf16 / struct f16); conversion
// from float rounds to nearest, ties to even, as the hardware does, and keeps NaN a NaN.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace fsdp {

enum class DType : uint8_t { f32, bf16, f16, f64, i64, i32, u16, u8 };

constexpr int kNumDTypes = 8;

size_t dtype_size(DType t);
const char* dtype_name(DType t);          // "f32", "bf16", ...
DType dtype_from_name(const std::string& name);  // accepts "f32"/"float32"/"fp32", ...; throws DTypeError
bool is_floating(DType t);

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

// Host conversions between any element type and double (exact for every type but the
// 64-bit integers beyond 2^53).
template <typename T> inline double to_double(T v) { return static_cast<double>(v); }
template <> inline double to_double(bf16 v) { return static_cast<float>(v); }
template <> inline double to_double(f16 v) { return static_cast<float>(v); }
template <typename T> inline T from_double(double v) { return static_cast<T>(v); }
template <> inline bf16 from_double<bf16>(double v) { return bf16(static_cast<float>(v)); }
template <> inline f16 from_double<f16>(double v) { return f16(static_cast<float>(v)); }

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
  }
  return f(float{});  // unreachable: every enumerator is handled above
}

}  // namespace fsdp
