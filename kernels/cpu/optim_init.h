// CPU fused AdamW and the counter-based initializers.
#pragma once

#include <cstdint>

#include "kernels/scalar_math.h"
#include "kernels/nn_shapes.h"
#include "runtime/core/dtype.h"

namespace fsdp::kernels::cpu {

// One AdamW update of n contiguous elements, computed in double.
void adamw_step(const AdamWBuffers& buf, int64_t n, const AdamWScalars& s);

// out[i] = element (offset + i) of the (seed, key) stream; out is contiguous, any floating.
void init_normal(void* out, DType dtype, int64_t n, uint64_t seed, uint64_t key, int64_t offset,
                 double mean, double std);
void init_uniform(void* out, DType dtype, int64_t n, uint64_t seed, uint64_t key, int64_t offset,
                  double low, double high);

}  // namespace fsdp::kernels::cpu
