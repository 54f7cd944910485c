// CPU counter-based initializers (the twins of kernels/cuda/init.h).
#pragma once

#include <cstdint>

#include "runtime/core/dtype.h"

namespace fsdp::kernels::cpu {

// out[i] = element (offset + i) of the (seed, key) stream; out is contiguous, any floating.
void init_normal(void* out, DType dtype, int64_t n, uint64_t seed, uint64_t key, int64_t offset,
                 double mean, double std);
void init_uniform(void* out, DType dtype, int64_t n, uint64_t seed, uint64_t key, int64_t offset,
                  double low, double high);

}  // namespace fsdp::kernels::cpu
