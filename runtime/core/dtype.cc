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
    case DType::u8:
    case DType::f8e4m3:
    case DType::f8e5m2: return 1;
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
    case DType::f8e4m3: return "f8e4m3";
    case DType::f8e5m2: return "f8e5m2";
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
  if (n == "f8e4m3" || n == "float8_e4m3fn" || n == "e4m3") return DType::f8e4m3;
  if (n == "f8e5m2" || n == "float8_e5m2" || n == "e5m2") return DType::f8e5m2;
  FSDP_THROW(DTypeError, "unknown dtype '", name,
             "' (expected one of f32, bf16, f16, f64, i64, i32, u16, u8, f8e4m3, f8e5m2)");
}

bool is_floating(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16 || t == DType::f64;
}

bool is_fp8(DType t) { return t == DType::f8e4m3 || t == DType::f8e5m2; }

float fp8_max(DType t) {
  if (t == DType::f8e4m3) return f8e4m3::kMax;
  if (t == DType::f8e5m2) return f8e5m2::kMax;
  FSDP_THROW(DTypeError, "fp8_max: ", dtype_name(t), " is not an FP8 dtype");
}

namespace {

// float -> an FP8 format of `mbits` mantissa bits and exponent bias `bias`, whose largest
// finite byte is `max_code`: round to nearest, ties to even, then saturate (what the GPU's
// cvt.rn.satfinite gives); NaN becomes the canonical 0x7f. Written on the float's bits, so
// that no step rounds twice.
uint8_t float_to_fp8(float f, int mbits, int bias, uint32_t max_code) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;  // NaN
  const int exp32 = int(a >> 23);
  // An f32 subnormal (or zero) is below 2^-126, far under half the smallest FP8 subnormal.
  if (exp32 == 0) return uint8_t(sign);
  const int e = exp32 - 127;                // |f| = sig * 2^(e - 23), sig in [2^23, 2^24)
  const uint32_t sig = (a & 0x7fffffu) | 0x800000u;
  const int min_normal = 1 - bias;          // FP8 subnormals share the smallest exponent
  const int te = e > min_normal ? e : min_normal;
  // |f| in units of the FP8 quantum 2^(te - mbits): sig shifted right by `shift`.
  const int shift = 23 - mbits + (te - e);
  uint32_t n = 0;
  if (shift <= 24) {  // else |f| < 2^(te - mbits - 1): below half a quantum, rounds to zero
    const uint32_t rem = sig & ((1u << shift) - 1u), half = 1u << (shift - 1);
    n = sig >> shift;
    if (rem > half || (rem == half && (n & 1u))) ++n;
  }
  // Biased exponent field (te + bias) above the implicit bit: n in [2^mbits, 2^(mbits+1)]
  // for normals carries into the exponent by itself; subnormals (te = min_normal) have
  // n < 2^mbits and field 0.
  const int64_t code = (int64_t(te + bias - 1) << mbits) + int64_t(n);
  return uint8_t(sign | (code > int64_t(max_code) ? max_code : uint32_t(code)));
}

// An FP8 byte -> float (exact). `has_inf`: e5m2's all-ones exponent holds infinities and
// NaNs; e4m3 has only the NaN 0x7f / 0xff and uses the rest of that exponent for values.
float fp8_to_float(uint8_t b, int mbits, int bias, bool has_inf) {
  const uint32_t sign = uint32_t(b & 0x80u) << 24;
  const int ebits = 7 - mbits;
  const uint32_t exp = (b >> mbits) & ((1u << ebits) - 1u);
  const uint32_t man = b & ((1u << mbits) - 1u);
  if (has_inf && exp == (1u << ebits) - 1u)
    return bits_float(sign | 0x7f800000u | (man ? 0x400000u : 0u));
  if (!has_inf && (b & 0x7fu) == 0x7fu) return bits_float(0x7fc00000u);
  if (exp == 0) {  // man * 2^(1 - bias - mbits), exact in float
    const float v = float(man) * bits_float(uint32_t(127 + 1 - bias - mbits) << 23);
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 127u - uint32_t(bias)) << 23) | (man << (23 - mbits)));
}

}  // namespace

uint8_t f8e4m3::from_float(float f) { return float_to_fp8(f, 3, 7, 0x7eu); }
float f8e4m3::to_float(uint8_t b) { return fp8_to_float(b, 3, 7, false); }
uint8_t f8e5m2::from_float(float f) { return float_to_fp8(f, 2, 15, 0x7bu); }
float f8e5m2::to_float(uint8_t b) { return fp8_to_float(b, 2, 15, true); }

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
