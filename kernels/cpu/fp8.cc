#include "kernels/cpu/fp8.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/float_types.h"
#include "kernels/cpu/matmul.h"
#include "kernels/fp8_math.h"
#include "runtime/core/error.h"

namespace fsdp::kernels::cpu {
namespace {

// The FP8 byte of v as the GPU's cvt.rn.satfinite gives it.
template <typename F8>
inline uint8_t fp8_bits(float v) {
  return F8::from_float(v);
}

// f(f8e4m3{}) or f(f8e5m2{}).
template <typename F>
void dispatch_fp8(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::f8e4m3: f(f8e4m3{}); return;
    case DType::f8e5m2: f(f8e5m2{}); return;
    default:
      FSDP_THROW(DTypeError, what, ": FP8 dtype (f8e4m3, f8e5m2) expected, got ", dtype_name(t));
  }
}

// n FP8 bytes of `dtype` decoded to floats (exact).
std::vector<float> decode(const void* p, DType dtype, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  const uint8_t* b = static_cast<const uint8_t*>(p);
  dispatch_fp8(dtype, "fp8_matmul", [&](auto tag) {
    using F8 = decltype(tag);
    for (int64_t i = 0; i < n; ++i) out[size_t(i)] = F8::to_float(b[i]);
  });
  return out;
}

}  // namespace

void fp8_amax(const void* x, DType dtype, int64_t n, float* amax) {
  dispatch_any_floating(dtype, "fp8_amax", [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x);
    // |x| rounded to f32 first, as the GPU reads it: the max of f32 values is exact.
    float m = 0.0f;
    for (int64_t i = 0; i < n; ++i) m = std::fmax(m, std::fabs(static_cast<float>(p[i])));
    *amax = m;
  });
}

void fp8_compute_scale(const float* amax, float fp8_max, float* scale, float* scale_inv) {
  const float s = fp8_scale_from_amax(*amax, fp8_max);
  *scale = s;
  *scale_inv = 1.0f / s;
}

void fp8_quantize(const void* x, DType dtype, int64_t rows, int64_t cols, const float* scale,
                  void* out, void* out_t, DType fp8) {
  const float s = *scale;
  dispatch_any_floating(dtype, "fp8_quantize", [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x);
    dispatch_fp8(fp8, "fp8_quantize", [&](auto f8tag) {
      using F8 = decltype(f8tag);
      uint8_t* o = static_cast<uint8_t*>(out);
      uint8_t* ot = static_cast<uint8_t*>(out_t);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          // One f32 product, then one rounding to FP8: the GPU's two steps.
          const uint8_t q = fp8_bits<F8>(static_cast<float>(p[r * cols + c]) * s);
          if (o) o[r * cols + c] = q;
          if (ot) ot[c * rows + r] = q;
        }
    });
  });
}

void fp8_matmul(const MatmulDims& d, void* out, DType out_dtype, const void* a, DType a_dtype,
                const float* a_scale_inv, const void* b, DType b_dtype, const float* b_scale_inv,
                double alpha, double beta, const void* bias, void* aux, MatmulEpilogue epilogue) {
  FSDP_CHECK(!d.trans_a && d.trans_b && d.batch == 1, ValueError,
             "fp8_matmul: FP8 products are a (M, K) @ b (N, K)^T only");
  FSDP_CHECK(!(a_dtype == DType::f8e5m2 && b_dtype == DType::f8e5m2), DTypeError,
             "fp8_matmul: at most one operand may be f8e5m2 (as on Hopper)");
  // Decoded exactly; the products of FP8 values are exact in f32, their sums are rounded as
  // any f32 matmul's.
  const std::vector<float> af = decode(a, a_dtype, d.m * d.k), bf = decode(b, b_dtype, d.n * d.k);
  const double scaled_alpha = alpha * double(*a_scale_inv) * double(*b_scale_inv);
  matmul(d, out, out_dtype, af.data(), bf.data(), DType::f32, scaled_alpha, beta, bias, aux,
         epilogue);
}

}  // namespace fsdp::kernels::cpu
