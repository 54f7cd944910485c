// CPU fused AdamW (the twin of kernels/cuda/adamw.h).
#pragma once

#include <cstdint>

#include "kernels/nn_shapes.h"
#include "kernels/scalar_math.h"
#include "runtime/core/dtype.h"

namespace fsdp::kernels::cpu {

// One AdamW update of n contiguous elements, computed in double.
void adamw_step(const AdamWBuffers& buf, int64_t n, const AdamWScalars& s);

}  // namespace fsdp::kernels::cpu
