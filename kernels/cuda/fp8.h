// CUDA FP8 quantization kernels (twins of kernels/cpu/fp8.h): the largest magnitude of a
// tensor, the per-tensor scale from it (kernels/fp8_math.h), and the cast to FP8 with, in
// the same pass, its transpose (cuBLASLt multiplies FP8 only with K contiguous in both
// operands, so the backward's products need the transposes). Raw pointers, sizes and a
// stream; every launch is checked. The FP8 matmul is Blas::fp8_matmul (matmul.h).
#pragma once

#include <cstdint>

#include "runtime/core/dtype.h"

struct CUstream_st;

namespace fsdp::kernels::cuda {

// *amax (device f32) = the largest |x| over n contiguous elements (f32, f64, bf16, f16),
// NaN elements left out, as the CPU twin: *amax is zeroed first, then raised atomically
// (a max is the same in any order).
void fp8_amax(const void* x, DType dtype, int64_t n, float* amax, CUstream_st* stream);

// *scale = fp8_scale_from_amax(*amax, fp8_max), *scale_inv = 1 / *scale (device f32 each).
void fp8_compute_scale(const float* amax, float fp8_max, float* scale, float* scale_inv,
                       CUstream_st* stream);

// out (rows, cols) and/or out_t (cols, rows) (either may be null) = the FP8 `fp8` bytes of
// x (rows, cols) row-major (f32, f64, bf16, f16) times *scale (device f32): one f32 product
// and the hardware's saturating round-to-nearest-even cast (sm_89+), NaN to 0x7f.
void fp8_quantize(const void* x, DType dtype, int64_t rows, int64_t cols, const float* scale,
                  void* out, void* out_t, DType fp8, CUstream_st* stream);

}  // namespace fsdp::kernels::cuda
