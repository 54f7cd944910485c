// CPU reference of FP8 quantization and FP8 matmuls (the twins of kernels/cuda/fp8.h, and of
// fp8_blocks.h and fp8_rows.h beside it). On the CPU they simulate FP8 training for tests:
// the bytes and scales are exactly the GPU's; the products are computed from the decoded
// values in f32 or f64.
#pragma once

#include <cstdint>

#include "kernels/fp8_format.h"
#include "kernels/nn_shapes.h"
#include "runtime/core/dtype.h"

namespace fsdp::kernels::cpu {

// max |x| over n elements of any floating dtype, as a float (|x| rounded to float first).
float fp8_amax(const void* x, DType dtype, int64_t n);

// q (rows, cols) = fp8(x * scale) and, when qt is not null, qt (cols, rows) its transpose,
// with scale = fp8_scale_for_amax(amax); *scale_inv = 1 / scale (f32). x: contiguous
// (rows, cols) of any floating dtype, converted to float before scaling. When record_amax is
// not null, *record_amax = max(*record_amax, max |x|) (delayed scaling's step amax).
void fp8_quantize(const void* x, DType dtype, int64_t rows, int64_t cols, float amax,
                  Fp8Format format, uint8_t* q, uint8_t* qt, float* scale_inv,
                  float* record_amax = nullptr);

// scale_inv[i] = 1 / fp8_scale_for_amax(amax[i]) for n amaxes (f32): the inverse scales
// fp8_quantize writes, for operands quantized elsewhere (FP8 weight shards).
void fp8_scale_inverses(const float* amax, int64_t n, Fp8Format format, float* scale_inv);

// Block scaling (kernels/fp8_format.h): x (rows, cols), any floating dtype, quantized with
// one scale per block, scale = fp8_scale_for_amax(the block's max |x|). q (rows, cols) with
// its inverse scales q_scale_inv in the grid of (rows, cols) (blocks along cols), and qt
// (cols, rows) with qt_scale_inv in the grid of (cols, rows) (blocks along rows: the
// product reading it has the rows as K). 1x128: q's blocks are 128 columns of a row, qt's
// 128 rows of a column (different blocks, so qt is not q transposed); 128x128: the same
// blocks for both, qt is q transposed and its scale grid the transpose of q's. Either of q
// and qt may be null (with its scales); padding entries of the grids are set to 1.
void fp8_quantize_blocks(const void* x, DType dtype, int64_t rows, int64_t cols, Fp8Format format,
                         Fp8Granularity granularity, uint8_t* q, float* q_scale_inv, uint8_t* qt,
                         float* qt_scale_inv);

// Row scaling (kernels/fp8_format.h): amax (rows) = max |x| over each row of x (rows, cols),
// any floating dtype (|x| rounded to float first; NaNs skipped); fp8_column_amax: amax (cols)
// over each column.
void fp8_row_amax(const void* x, DType dtype, int64_t rows, int64_t cols, float* amax);
void fp8_column_amax(const void* x, DType dtype, int64_t rows, int64_t cols, float* amax);

// Quantizes x (rows, cols) row-wise: q (rows, cols) with row r scaled by
// fp8_scale_for_amax(row_amax[r]) and q_scale_inv[r] its inverse; qt (cols, rows), the
// transpose, with its row c (x's column c) scaled by column_amax[c] and qt_scale_inv[c] its
// inverse. Either of q and qt may be null (with its amaxes and scales); the grids' padding
// is left as it is.
void fp8_quantize_rowwise(const void* x, DType dtype, int64_t rows, int64_t cols, Fp8Format format,
                          const float* row_amax, uint8_t* q, float* q_scale_inv,
                          const float* column_amax, uint8_t* qt, float* qt_scale_inv);

// Delayed scaling after a step, for `layers` layers of `width` operands each: history
// (layers, len, width) f32, step_amax and scale_amax (layers, width) f32; each operand's
// history and scale_amax as fp8_update_amax_history (kernels/fp8_format.h) sets them.
void fp8_update_amax_histories(float* history, const float* step_amax, float* scale_amax,
                               int64_t layers, int64_t len, int64_t width, bool roll,
                               bool use_max, float margin_factor);

// out (M, N) = alpha * sa * sb * a @ b^T + beta * out [+ bias] [epilogue], with a (M, K)
// and b (N, K) FP8 (the one layout FP8 tensor cores take: both operands K-major) and
// sa, sb their inverse scales. out, bias and aux have out_dtype (f32 or f64).
void fp8_matmul(int64_t m, int64_t n, int64_t k, void* out, DType out_dtype, const uint8_t* a,
                Fp8Format format_a, float scale_inv_a, const uint8_t* b, Fp8Format format_b,
                float scale_inv_b, double alpha, double beta, const void* bias, void* aux,
                MatmulEpilogue epilogue);

// The block-scaled product: out (M, N) = alpha * a (M, K) @ b (N, K)^T + beta * out [+ bias]
// [epilogue], each operand dequantized block by block (its decoded bytes times the inverse
// scale of their block, exact in f64) before the product, which runs in out_dtype (f32 or
// f64). ga and gb: each operand's granularity (tensor-wise: sa and sb point to one scale).
void fp8_matmul_blocks(int64_t m, int64_t n, int64_t k, void* out, DType out_dtype,
                       const uint8_t* a, Fp8Format format_a, Fp8Granularity ga, const float* sa,
                       const uint8_t* b, Fp8Format format_b, Fp8Granularity gb, const float* sb,
                       double alpha, double beta, const void* bias, void* aux,
                       MatmulEpilogue epilogue);

}  // namespace fsdp::kernels::cpu
