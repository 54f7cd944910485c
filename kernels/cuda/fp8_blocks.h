// CUDA kernels of FP8 block-wise quantization (the blockwise recipe; the twins of
// kernels/cpu/fp8.h's fp8_quantize_blocks). Raw pointers, sizes and a stream.
#pragma once

#include <cstdint>

#include "kernels/cuda/basic.h"
#include "kernels/cuda/column_sum.h"
#include "kernels/fp8_format.h"

namespace fsdp::kernels::cuda {

// x (rows, cols) (bf16, f16 or f32) quantized one block at a time, each block scaled by
// fp8_scale_for_amax(its max |x|): q (rows, cols) with its inverse scales q_scale_inv in the
// grid of fp8_scale_grid(granularity, rows, cols) (blocks along cols), qt (cols, rows) with
// qt_scale_inv in the grid of (cols, rows) (blocks along rows), as cpu::fp8_quantize_blocks
// lays them out; either of q and qt may be null (with its scales). Padding entries of the
// grids are not written (the caller sets them). One block of threads per 128 x 128 tile of
// x, read once for both layouts. With column_sums.out: column_sums.out += the column sums of
// x (unscaled), from the same read (a bias gradient), through partials of
// (fp8_block_column_sum_tiles(rows), cols) f32.
int64_t fp8_block_column_sum_tiles(int64_t rows);
void fp8_quantize_blocks(const void* x, DType dtype, int64_t rows, int64_t cols, Fp8Format format,
                         Fp8Granularity granularity, uint8_t* q, float* q_scale_inv, uint8_t* qt,
                         float* qt_scale_inv, const ColumnSums& column_sums, stream_t stream);

}  // namespace fsdp::kernels::cuda
