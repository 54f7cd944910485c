#include "kernels/cpu/fp8.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/float_types.h"
#include "kernels/cpu/matmul.h"

namespace fsdp::kernels::cpu {

float fp8_amax(const void* x, DType dtype, int64_t n) {
  float amax = 0.0f;
  dispatch_any_floating(dtype, "fp8_amax", [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x);
    for (int64_t i = 0; i < n; ++i) {
      const float a = std::fabs(float(to_double(p[i])));
      amax = std::fmax(amax, a);  // NaN is skipped, as the GPU's fmaxf skips it
    }
  });
  return amax;
}

void fp8_quantize(const void* x, DType dtype, int64_t rows, int64_t cols, float amax,
                  Fp8Format format, uint8_t* q, uint8_t* qt, float* scale_inv,
                  float* record_amax) {
  if (record_amax) *record_amax = std::fmax(*record_amax, fp8_amax(x, dtype, rows * cols));
  const float scale = fp8_scale_for_amax(amax, format);
  *scale_inv = 1.0f / scale;
  dispatch_any_floating(dtype, "fp8_quantize", [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const uint8_t v = fp8_encode(float(to_double(p[r * cols + c])) * scale, format);
        if (q) q[r * cols + c] = v;
        if (qt) qt[c * rows + r] = v;
      }
  });
}

void fp8_scale_inverses(const float* amax, int64_t n, Fp8Format format, float* scale_inv) {
  for (int64_t i = 0; i < n; ++i) scale_inv[i] = 1.0f / fp8_scale_for_amax(amax[i], format);
}

void fp8_quantize_blocks(const void* x, DType dtype, int64_t rows, int64_t cols, Fp8Format format,
                         Fp8Granularity granularity, uint8_t* q, float* q_scale_inv, uint8_t* qt,
                         float* qt_scale_inv) {
  const Fp8ScaleGrid grid = fp8_scale_grid(granularity, rows, cols);       // q's, K = cols
  const Fp8ScaleGrid grid_t = fp8_scale_grid(granularity, cols, rows);     // qt's, K = rows
  if (q_scale_inv) std::fill(q_scale_inv, q_scale_inv + grid.outer * grid.inner, 1.0f);
  if (qt_scale_inv) std::fill(qt_scale_inv, qt_scale_inv + grid_t.outer * grid_t.inner, 1.0f);
  const bool square = granularity == Fp8Granularity::block_128x128;
  dispatch_any_floating(dtype, "fp8_quantize_blocks", [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x);
    auto at = [&](int64_t r, int64_t c) { return float(to_double(p[r * cols + c])); };
    // Quantizes the block rows [r0, r1) x columns [c0, c1) with its own amax into `dst`
    // (q or qt) at the element's place, and records its inverse scale at `sinv`.
    auto block = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1, bool into_q, bool into_qt) {
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::fmax(amax, std::fabs(at(r, c)));
      const float scale = fp8_scale_for_amax(amax, format);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          const uint8_t v = fp8_encode(at(r, c) * scale, format);
          if (into_q) q[r * cols + c] = v;
          if (into_qt) qt[c * rows + r] = v;
        }
      const float inv = 1.0f / scale;
      if (into_q) q_scale_inv[fp8_scale_index(granularity, rows, cols, r0, c0)] = inv;
      if (into_qt) qt_scale_inv[fp8_scale_index(granularity, cols, rows, c0, r0)] = inv;
    };
    if (square) {  // one set of blocks serves both layouts
      for (int64_t r0 = 0; r0 < rows; r0 += kFp8Block)
        for (int64_t c0 = 0; c0 < cols; c0 += kFp8Block)
          block(r0, std::min(rows, r0 + kFp8Block), c0, std::min(cols, c0 + kFp8Block), q, qt);
      return;
    }
    if (q)  // 128 columns of one row
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c0 = 0; c0 < cols; c0 += kFp8Block)
          block(r, r + 1, c0, std::min(cols, c0 + kFp8Block), true, false);
    if (qt)  // 128 rows of one column
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t r0 = 0; r0 < rows; r0 += kFp8Block)
          block(r0, std::min(rows, r0 + kFp8Block), c, c + 1, false, true);
  });
}

void fp8_row_amax(const void* x, DType dtype, int64_t rows, int64_t cols, float* amax) {
  dispatch_any_floating(dtype, "fp8_row_amax", [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x);
    for (int64_t r = 0; r < rows; ++r) {
      float m = 0.0f;
      for (int64_t c = 0; c < cols; ++c) m = std::fmax(m, std::fabs(float(to_double(p[r * cols + c]))));
      amax[r] = m;
    }
  });
}

void fp8_column_amax(const void* x, DType dtype, int64_t rows, int64_t cols, float* amax) {
  std::fill(amax, amax + cols, 0.0f);
  dispatch_any_floating(dtype, "fp8_column_amax", [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        amax[c] = std::fmax(amax[c], std::fabs(float(to_double(p[r * cols + c]))));
  });
}

void fp8_quantize_rowwise(const void* x, DType dtype, int64_t rows, int64_t cols, Fp8Format format,
                          const float* row_amax, uint8_t* q, float* q_scale_inv,
                          const float* column_amax, uint8_t* qt, float* qt_scale_inv) {
  std::vector<float> row_scale(q ? size_t(rows) : 0), column_scale(qt ? size_t(cols) : 0);
  for (size_t r = 0; r < row_scale.size(); ++r) {
    row_scale[r] = fp8_scale_for_amax(row_amax[r], format);
    q_scale_inv[r] = 1.0f / row_scale[r];
  }
  for (size_t c = 0; c < column_scale.size(); ++c) {
    column_scale[c] = fp8_scale_for_amax(column_amax[c], format);
    qt_scale_inv[c] = 1.0f / column_scale[c];
  }
  dispatch_any_floating(dtype, "fp8_quantize_rowwise", [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const float v = float(to_double(p[r * cols + c]));
        if (q) q[r * cols + c] = fp8_encode(v * row_scale[size_t(r)], format);
        if (qt) qt[c * rows + r] = fp8_encode(v * column_scale[size_t(c)], format);
      }
  });
}

void fp8_update_amax_histories(float* history, const float* step_amax, float* scale_amax,
                               int64_t layers, int64_t len, int64_t width, bool roll,
                               bool use_max, float margin_factor) {
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t o = 0; o < width; ++o) {
      const int64_t i = l * width + o;
      scale_amax[i] = fp8_update_amax_history(history + l * len * width + o, len, width,
                                              step_amax[i], roll, use_max, margin_factor);
    }
}

namespace {

// out (M, N) = alpha * a (M, K) @ b (N, K)^T + beta * out [+ bias] [epilogue], from operands
// already decoded (exact in f64 and f32), computed in out's dtype as the FP8 products are.
void decoded_product(int64_t m, int64_t n, int64_t k, void* out, DType out_dtype,
                     const std::vector<double>& a, const std::vector<double>& b, double alpha,
                     double beta, const void* bias, void* aux, MatmulEpilogue epilogue) {
  MatmulDims d;
  d.m = m;
  d.n = n;
  d.k = k;
  d.trans_b = true;
  dispatch_compute(out_dtype, "fp8_matmul", [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> ta(a.begin(), a.end()), tb(b.begin(), b.end());
    matmul(d, out, out_dtype, ta.data(), tb.data(), out_dtype, alpha, beta, bias, aux, epilogue);
  });
}

}  // namespace

void fp8_matmul(int64_t m, int64_t n, int64_t k, void* out, DType out_dtype, const uint8_t* a,
                Fp8Format format_a, float scale_inv_a, const uint8_t* b, Fp8Format format_b,
                float scale_inv_b, double alpha, double beta, const void* bias, void* aux,
                MatmulEpilogue epilogue) {
  // The decoded operands are exact in f32 (and f64); the product runs in out's dtype.
  auto decode = [&](const uint8_t* q, Fp8Format f, int64_t count) {
    std::vector<double> v(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) v[size_t(i)] = fp8_decode(q[i], f);
    return v;
  };
  const std::vector<double> da = decode(a, format_a, m * k), db = decode(b, format_b, n * k);
  // The CUDA path multiplies by one f32 alpha: alpha * (sa * sb), each product rounded.
  const double scaled_alpha = double(float(alpha) * (scale_inv_a * scale_inv_b));
  decoded_product(m, n, k, out, out_dtype, da, db, scaled_alpha, beta, bias, aux, epilogue);
}

void fp8_matmul_blocks(int64_t m, int64_t n, int64_t k, void* out, DType out_dtype,
                       const uint8_t* a, Fp8Format format_a, Fp8Granularity ga, const float* sa,
                       const uint8_t* b, Fp8Format format_b, Fp8Granularity gb, const float* sb,
                       double alpha, double beta, const void* bias, void* aux,
                       MatmulEpilogue epilogue) {
  // Each element decoded and times its block's inverse scale: exact in f64 (a 4-bit
  // significand times a 24-bit one).
  auto dequantize = [&](const uint8_t* q, Fp8Format f, Fp8Granularity g, const float* s,
                        int64_t rows) {
    std::vector<double> v(static_cast<size_t>(rows * k));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < k; ++c)
        v[size_t(r * k + c)] = double(fp8_decode(q[r * k + c], f)) *
                               double(s[fp8_scale_index(g, rows, k, r, c)]);
    return v;
  };
  const std::vector<double> da = dequantize(a, format_a, ga, sa, m);
  const std::vector<double> db = dequantize(b, format_b, gb, sb, n);
  decoded_product(m, n, k, out, out_dtype, da, db, alpha, beta, bias, aux, epilogue);
}

}  // namespace fsdp::kernels::cpu
