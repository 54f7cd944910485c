// CUDA kernels of FP8 row-wise quantization (the rowwise recipe; the twins of
// kernels/cpu/fp8.h's fp8_row_amax, fp8_column_amax and fp8_quantize_rowwise). Raw
// pointers, sizes and a stream.
#pragma once

#include <cstdint>

#include "kernels/cuda/basic.h"
#include "kernels/cuda/column_sum.h"
#include "kernels/fp8_format.h"

namespace fsdp::kernels::cuda {

// amax (rows) f32 = max |x| over each row of x (rows, cols) (bf16, f16 or f32; NaNs
// skipped); fp8_column_amax: amax (cols) over each column (an integer atomicMax of the
// bits: the result does not depend on the order).
void fp8_row_amax(const void* x, DType dtype, int64_t rows, int64_t cols, float* amax,
                  stream_t stream);
void fp8_column_amax(const void* x, DType dtype, int64_t rows, int64_t cols, float* amax,
                     stream_t stream);

// x (rows, cols) quantized row-wise from one read of it: q (rows, cols) with row r scaled by
// fp8_scale_for_amax(row_amax[r]) and q_scale_inv[r] its inverse; qt (cols, rows), the
// transpose, with its row c scaled by that of column_amax[c] and qt_scale_inv[c] its
// inverse. Either of q and qt may be null (with its amaxes and scales). With
// column_sums.out: column_sums.out += the column sums of x, from the same read (a bias
// gradient), through partials of (fp8_column_sum_tiles(rows), cols) f32 (fp8.h: the same
// tiles as fp8_quantize's).
void fp8_quantize_rowwise(const void* x, DType dtype, int64_t rows, int64_t cols, Fp8Format format,
                          const float* row_amax, uint8_t* q, float* q_scale_inv,
                          const float* column_amax, uint8_t* qt, float* qt_scale_inv,
                          const ColumnSums& column_sums, stream_t stream);

}  // namespace fsdp::kernels::cuda
