// CUDA twin of kernels/cpu/block_reduce.h.
#pragma once

#include <cstdint>

#include "runtime/core/dtype.h"

struct CUstream_st;

namespace fsdp::kernels::cuda {

// One thread block per data block; each thread sums a fixed strided subset in f32 (f64 for
// f64), then a fixed-shape tree combines the threads: deterministic for a given block size.
void block_sum_squares(const void* x, DType dtype, int64_t nblocks, int64_t block, void* out,
                       CUstream_st* stream);

}  // namespace fsdp::kernels::cuda
