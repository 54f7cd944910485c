#include "runtime/core/dtype.h"

#include <algorithm>
#include <cctype>

#include "runtime/core/error.h"

namespace fsdp {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64:
    case DType::i64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::bf16:
    case DType::f16:
    case DType::u16: return 2;
    case DType::u8: return 1;
  }
  FSDP_THROW(DTypeError, "unknown dtype code ", int(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::f64: return "f64";
    case DType::i64: return "i64";
    case DType::i32: return "i32";
    case DType::u16: return "u16";
    case DType::u8: return "u8";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (n == "f32" || n == "fp32" || n == "float32" || n == "float") return DType::f32;
  if (n == "bf16" || n == "bfloat16") return DType::bf16;
  if (n == "f16" || n == "fp16" || n == "float16" || n == "half") return DType::f16;
  if (n == "f64" || n == "fp64" || n == "float64" || n == "double") return DType::f64;
  if (n == "i64" || n == "int64") return DType::i64;
  if (n == "i32" || n == "int32") return DType::i32;
  if (n == "u16" || n == "uint16") return DType::u16;
  if (n == "u8" || n == "uint8") return DType::u8;
  FSDP_THROW(DTypeError, "unknown dtype '", name,
             "' (expected one of f32, bf16, f16, f64, i64, i32, u16, u8)");
}

bool is_floating(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16 || t == DType::f64;
}

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
uint16_t f16::from_float(float f) {
  uint32_t u = float_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) {
    // >= 65520 rounds to infinity (65504 is the largest finite half).
    return uint16_t(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): value = m * 2^-24 with m in [0, 1024).
    // Scale into integer units of 2^-24 and round to nearest even.
    float a = bits_float(abs);
    float scaled = a * 16777216.0f;  // 2^24, exact
    uint32_t m = uint32_t(scaled);
    float frac = scaled - float(m);
    if (frac > 0.5f || (frac == 0.5f && (m & 1u))) ++m;
    return uint16_t(sign | m);  // m == 1024 becomes the smallest normal, correctly
  }
  // Normal: rebias exponent from 127 to 15 and round the 13 dropped mantissa bits.
  uint32_t rebased = abs - ((127u - 15u) << 23);
  uint32_t rounding_bias = 0xfffu + ((rebased >> 13) & 1u);
  return uint16_t(sign | ((rebased + rounding_bias) >> 13));
}

float f16::to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    float v = float(man) / 16777216.0f;  // man * 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (man << 13));
  return bits_float(sign | ((exp + 127u - 15u) << 23) | (man << 13));
}

}  // namespace fsdp
