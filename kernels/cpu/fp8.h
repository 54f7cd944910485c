// CPU twins of the FP8 kernels (kernels/cuda/fp8.h, Blas::fp8_matmul): per-tensor scaling,
// the cast to FP8 with its transpose, and the FP8 matmul simulated in f32. Raw pointers and
// sizes only. The casts round exactly as the GPU's cvt.rn.satfinite does (f8e4m3 / f8e5m2 of
// runtime/core/dtype.h), so the CPU simulates FP8 training bit for bit up to the matmuls'
// accumulation order. For tests: a real run refuses FP8 on the CPU.
#pragma once

#include <cstdint>

#include "kernels/nn_shapes.h"
#include "runtime/core/dtype.h"

namespace fsdp::kernels::cpu {

// *amax = the largest |x| over n contiguous elements (f32, f64, bf16 or f16), NaN elements
// left out (0 when n is 0 or every element is NaN), rounded to f32.
void fp8_amax(const void* x, DType dtype, int64_t n, float* amax);

// scale and scale_inv from amax (kernels/fp8_math.h): *scale = fp8_scale_from_amax(*amax,
// fp8_max), *scale_inv = 1 / *scale.
void fp8_compute_scale(const float* amax, float fp8_max, float* scale, float* scale_inv);

// Casts x (rows, cols) row-major (f32, f64, bf16 or f16) times *scale, both in f32, to FP8
// `fp8` (f8e4m3 or f8e5m2): into out (rows, cols) and/or its transpose out_t (cols, rows);
// either may be null.
void fp8_quantize(const void* x, DType dtype, int64_t rows, int64_t cols, const float* scale,
                  void* out, void* out_t, DType fp8);

// out (M, N) = alpha * (*a_scale_inv) * (*b_scale_inv) * a (M, K) @ b (N, K)^T + beta * out
// (+ bias (N)) then the epilogue, as kernels::cpu::matmul: a and b FP8 (not both f8e5m2),
// dims.trans_a false and dims.trans_b true (the only layout Hopper's FP8 matmul has). The
// FP8 values are decoded to f32 exactly and multiplied in f32; the scales are applied with
// alpha. out, bias and aux f32 or f64.
void fp8_matmul(const MatmulDims& dims, void* out, DType out_dtype, const void* a, DType a_dtype,
                const float* a_scale_inv, const void* b, DType b_dtype, const float* b_scale_inv,
                double alpha, double beta, const void* bias, void* aux, MatmulEpilogue epilogue);

}  // namespace fsdp::kernels::cpu
