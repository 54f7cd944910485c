// CPU LayerNorm and RMSNorm over the last dimension of contiguous (rows, channels) data.
// x, out, dx, weight, bias and the statistics (mean, rstd: (rows)) share the compute dtype
// (f32 or f64); dweight and dbias have the grad dtype (f32 or f64). Sums are in double.
// Null pointers skip what they point to (no bias; no dx; no dweight/dbias).
#pragma once

#include <cstdint>

#include "kernels/nn_shapes.h"
#include "runtime/core/dtype.h"

namespace fsdp::kernels::cpu {

void layernorm_forward(const NormDims& d, void* out, void* mean, void* rstd, const void* x,
                       const void* weight, const void* bias, double eps);
void layernorm_backward(const NormDims& d, void* dx, void* dweight, void* dbias,
                        const void* dout, const void* x, const void* weight, const void* mean,
                        const void* rstd, bool accumulate_dx, bool accumulate);

void rmsnorm_forward(const NormDims& d, void* out, void* rstd, const void* x, const void* weight,
                     double eps);
void rmsnorm_backward(const NormDims& d, void* dx, void* dweight, const void* dout, const void* x,
                      const void* weight, const void* rstd, bool accumulate_dx, bool accumulate);

}  // namespace fsdp::kernels::cpu
