// CPU reference for kernels/block_reduce.h.
#pragma once

#include <cstdint>

#include "runtime/core/dtype.h"

namespace fsdp::kernels::cpu {

// out[i] = sum of squares of x[i*block, (i+1)*block), summed in f64 in index order, stored
// as f32 (f64 for f64 input).
void block_sum_squares(const void* x, DType dtype, int64_t nblocks, int64_t block, void* out);

}  // namespace fsdp::kernels::cpu
