// Deterministic column sums on CUDA, shared by bias_backward, the position-embedding
// gradient and the norms' weight gradients: fixed blocks of rows write partial sums
// (blocks, n) in f32, then one pass adds each column's partials in block order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/basic.h"

namespace fsdp::kernels::cuda {

// How many row blocks column_partials() uses for m rows (a function of m alone).
int64_t column_row_blocks(int64_t m);

// partials (column_row_blocks(m), n) f32 = per-block column sums of x (m, n) (bf16 or f32).
void column_partials(const void* x, DType dtype, int64_t m, int64_t n, float* partials,
                     stream_t stream);

// out (n) (+)= sum over the `blocks` rows of partials (blocks, n), in block order. out is
// bf16 or f32.
void finish_column_sums(const float* partials, int64_t blocks, int64_t n, void* out,
                        DType out_dtype, bool accumulate, stream_t stream);

// A bias gradient summed beside another kernel's read of x (rows, cols) (the FP8 casts):
// out (cols) of out_dtype (bf16 or f32) += the column sums of x, which that kernel writes per
// row tile into partials (tiles, cols) f32, workspace, and finish_column_sums then adds in
// tile order. out null: no sums (partials unused).
struct ColumnSums {
  void* out = nullptr;
  DType out_dtype = DType::f32;
  float* partials = nullptr;
};

// The bias gradient built on them (the twin of kernels/cpu/matmul.h's bias_backward):
// dbias (n) (+)= sum over the m rows of dout (m, n). Deterministic: fixed
// row blocks write partial sums, then one pass adds the partials in block order.
size_t column_sum_workspace_bytes(int64_t m, int64_t n);
void bias_backward(void* dbias, DType grad_dtype, const void* dout, DType dtype, int64_t m,
                   int64_t n, bool accumulate, void* workspace, stream_t stream);

}  // namespace fsdp::kernels::cuda
