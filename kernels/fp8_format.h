// The two 8-bit floating formats of Hopper's FP8 tensor cores, and the scalar rules of
// tensor-wise scaling that the CPU reference and the CUDA kernels share.
//
//   e4m3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; largest finite 448, no infinities
//         (S.1111.111 is NaN). Weights and activations.
//   e5m2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; largest finite 57344. Gradients
//         in the "hybrid" recipe (more range, less precision).
//
// Quantizing x with scale s stores fp8(x * s), rounded to nearest, ties to even, and
// saturated to the largest finite value (the hardware's satfinite conversion); the product
// of two quantized operands is multiplied back by 1 / (s_a s_b).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"

namespace fsdp::kernels {

enum class Fp8Format : uint8_t { e4m3, e5m2 };

inline const char* fp8_format_name(Fp8Format f) { return f == Fp8Format::e4m3 ? "e4m3" : "e5m2"; }

FSDP_HD float fp8_max(Fp8Format f) { return f == Fp8Format::e4m3 ? 448.0f : 57344.0f; }
FSDP_HD int fp8_mantissa_bits(Fp8Format f) { return f == Fp8Format::e4m3 ? 3 : 2; }
FSDP_HD int fp8_exponent_bias(Fp8Format f) { return f == Fp8Format::e4m3 ? 7 : 15; }

// Whether an (M, K) @ (N, K)^T problem fits FP8 tensor cores: M, N, K multiples of 16 (and
// not empty).
inline bool fp8_shape_ok(int64_t m, int64_t n, int64_t k) {
  return m > 0 && n > 0 && k > 0 && m % 16 == 0 && n % 16 == 0 && k % 16 == 0;
}

// Block scaling (the "blockwise" recipe, DeepSeek-V3's): instead of one scale per tensor,
// one per block of a K-major operand (rows, K): 1x128 blocks (128 consecutive elements of a
// row along K; activations and gradients) or 128x128 blocks (weights). The inverse scales
// (f32) are laid out as cuBLASLt's VEC128_32F and BLK128x128_32F modes read them (Transformer
// Engine's "GEMM-ready" layout):
//   1x128:   (ceil(K / 128), pad4(rows)): for each block of K, the rows' scales contiguous
//            (outer-dimension major);
//   128x128: (ceil(rows / 128), pad4(ceil(K / 128))): for each block of rows, its blocks
//            along K contiguous;
// pad4 rounds up to a multiple of 4 (16-byte aligned columns); padding entries hold 1.
//
// Row scaling (the "rowwise" recipe): one scale per row of a K-major operand, over all of
// K, as cuBLASLt's OUTER_VEC_32F mode reads them: (1, pad4(rows)), the rows' scales
// contiguous. A product's two operands then scale its output by the outer product of their
// vectors: activations per token, weights per output feature in the forward.
enum class Fp8Granularity : uint8_t { tensor, block_1x128, block_128x128, row };

// What a tensor-wise cast reads: a tensor, or a value computed from an activation's tensors
// as the cast reads them, each element rounded to their dtype as the activation's kernel
// stores it, and never stored itself. swiglu: x (R, 2F) = [gate | up] gives silu(gate) * up
// (R, F), the activation; gelu_grad: the gradient at GELU's input from dout (R, C), the
// gradient at its output, and x (R, C), its input, gives (R, C); swiglu_grad: dout (R, F)
// and x (R, 2F) give (R, 2F) = [d gate | d up].
enum class Fp8CastSource : uint8_t { tensor, swiglu, gelu_grad, swiglu_grad };

// The columns of a cast source's values, given those of its x.
inline int64_t fp8_source_cols(Fp8CastSource source, int64_t x_cols) {
  return source == Fp8CastSource::swiglu ? x_cols / 2 : x_cols;
}
constexpr int64_t kFp8Block = 128;

inline const char* fp8_granularity_name(Fp8Granularity g) {
  switch (g) {
    case Fp8Granularity::tensor: return "tensor";
    case Fp8Granularity::block_1x128: return "1x128";
    case Fp8Granularity::block_128x128: return "128x128";
    case Fp8Granularity::row: return "row";
  }
  return "?";
}

FSDP_HD int64_t fp8_blocks(int64_t n) { return (n + kFp8Block - 1) / kFp8Block; }
FSDP_HD int64_t fp8_pad4(int64_t n) { return (n + 3) / 4 * 4; }

// The (outer, inner) shape of the inverse scales of a (rows, k) operand: (1, 1) tensor-wise.
struct Fp8ScaleGrid {
  int64_t outer = 1, inner = 1;
};
FSDP_HD Fp8ScaleGrid fp8_scale_grid(Fp8Granularity g, int64_t rows, int64_t k) {
  if (g == Fp8Granularity::block_1x128) return {fp8_blocks(k), fp8_pad4(rows)};
  if (g == Fp8Granularity::block_128x128) return {fp8_blocks(rows), fp8_pad4(fp8_blocks(k))};
  if (g == Fp8Granularity::row) return {1, fp8_pad4(rows)};
  return {1, 1};
}
// Where element (r, c) of a (rows, k) operand finds its inverse scale in that grid.
FSDP_HD int64_t fp8_scale_index(Fp8Granularity g, int64_t rows, int64_t k, int64_t r, int64_t c) {
  if (g == Fp8Granularity::block_1x128) return (c / kFp8Block) * fp8_pad4(rows) + r;
  if (g == Fp8Granularity::block_128x128)
    return (r / kFp8Block) * fp8_pad4(fp8_blocks(k)) + c / kFp8Block;
  if (g == Fp8Granularity::row) return r;
  return 0;
}

// Whether an (M, K) @ (N, K)^T problem fits block-scaled FP8 products, as the blockwise
// recipe uses them: every size a multiple of 128, so that each of a linear layer's three
// products (whose K are the input features, the output features and the tokens) has whole
// blocks along K.
inline bool fp8_block_shape_ok(int64_t m, int64_t n, int64_t k) {
  return m > 0 && n > 0 && k > 0 && m % kFp8Block == 0 && n % kFp8Block == 0 &&
         k % kFp8Block == 0;
}

// The scale that maps the largest magnitude `amax` onto the format's largest finite value:
// max / amax, or 1 when amax is 0 or not finite (nothing to scale by). One IEEE division,
// as the CUDA kernels compute it (__fdiv_rn), so both backends get the same bits.
FSDP_HD float fp8_scale_for_amax(float amax, Fp8Format f) {
  if (!(amax > 0.0f) || !(amax < INFINITY)) return 1.0f;
  const float s = fp8_max(f) / amax;
  return s < INFINITY ? s : 1.0f;  // a subnormal amax would overflow the scale
}

// Delayed scaling's rule for one operand after a step: its amax history (len entries,
// `stride` floats apart, entry 0 the newest) takes the step's amax as its newest entry,
// the oldest dropping out (roll false: the history stays as it is, as after a load); the
// amax the next step scales by is the newest entry ("most_recent") or the history's
// maximum ("max"), times margin_factor (2^fp8_margin: an exact power of two, so
// max / (amax * 2^m) is Transformer Engine's max / amax / 2^m). Shared by the CPU and
// CUDA kernels so that both backends keep the same bits.
FSDP_HD float fp8_update_amax_history(float* history, int64_t len, int64_t stride, float step_amax,
                                      bool roll, bool use_max, float margin_factor) {
  if (roll) {
    for (int64_t i = len - 1; i > 0; --i) history[i * stride] = history[(i - 1) * stride];
    history[0] = step_amax;
  }
  float amax = history[0];
  if (use_max)
    for (int64_t i = 1; i < len; ++i) amax = fmaxf(amax, history[i * stride]);
  return amax * margin_factor;
}

// The byte of fp8(v): round to nearest even, saturate to +-max, NaN -> 0x7f (sign kept).
// The host's twin of the CUDA conversion __nv_cvt_float_to_fp8(v, __NV_SATFINITE, fmt).
inline uint8_t fp8_encode(float v, Fp8Format f) {
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  if (std::isnan(v)) return uint8_t(sign | 0x7f);
  const int mbits = fp8_mantissa_bits(f), bias = fp8_exponent_bias(f);
  const int emin = 1 - bias;  // exponent of the smallest normal
  float a = std::fabs(v);
  if (a >= fp8_max(f)) a = fp8_max(f);
  if (a == 0.0f) return sign;
  int e = 0;
  std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1): the leading bit is 2^(e-1)
  const int lead = e - 1 < emin ? emin : e - 1;
  const float quantum = std::ldexp(1.0f, lead - mbits);
  float r = std::nearbyint(a / quantum) * quantum;  // exact scalings; ties to even
  if (r > fp8_max(f)) r = fp8_max(f);
  if (r == 0.0f) return sign;
  std::frexp(r, &e);
  if (e - 1 < emin) {  // subnormal: exponent field 0
    const int m = int(r / std::ldexp(1.0f, emin - mbits));
    return uint8_t(sign | m);
  }
  const int m = int(r / std::ldexp(1.0f, e - 1 - mbits)) - (1 << mbits);
  return uint8_t(sign | ((e - 1 + bias) << mbits) | m);
}

// The value of an fp8 byte (NaN for the NaN patterns; e5m2's infinities as infinities).
inline float fp8_decode(uint8_t b, Fp8Format f) {
  const int mbits = fp8_mantissa_bits(f), bias = fp8_exponent_bias(f);
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  const int exp_field = (b & 0x7f) >> mbits, m = b & ((1 << mbits) - 1);
  if (f == Fp8Format::e4m3 && (b & 0x7f) == 0x7f) return NAN;
  if (f == Fp8Format::e5m2 && exp_field == 0x1f) return m ? NAN : sign * INFINITY;
  if (exp_field == 0) return sign * std::ldexp(float(m), 1 - bias - mbits);
  return sign * std::ldexp(float((1 << mbits) + m), exp_field - bias - mbits);
}

}  // namespace fsdp::kernels
