// CPU rotary position embeddings (kernels/nn_shapes.h, RopeDims).
#pragma once

#include "kernels/nn_shapes.h"
#include "runtime/core/dtype.h"

namespace fsdp::kernels::cpu {

// out = x rotated by position (d.inverse: by the opposite angle), in place when out is x;
// computed in double, each element rounded once.
void rope(const RopeDims& d, void* out, const void* x, DType dtype);

}  // namespace fsdp::kernels::cpu
