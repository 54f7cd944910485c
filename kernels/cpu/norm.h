// CPU LayerNorm and RMSNorm over the last dimension of contiguous (rows, channels) data.
// x, out, dx, weight, bias and the statistics (mean, rstd: (rows)) share the compute dtype
// (f32 or f64); dweight and dbias have the grad dtype (f32 or f64). Sums are in double.
// Null pointers skip what they point to (no bias; no dx; no dweight/dbias).
//
// Forward with a residual (fused residual add): sum = x + residual, rounded to x's dtype, is
// stored and normalized (the same values as an add followed by the norm). Null residual and
// sum: out = norm(x).
// Backward: dx = dx_addend + the norm's gradient; dx_addend may be null (overwrite), dx itself
// (accumulate) or another tensor (the gradient that reached x by another path).
#pragma once

#include <cstdint>

#include "kernels/nn_shapes.h"
#include "runtime/core/dtype.h"

namespace fsdp::kernels::cpu {

void layernorm_forward(const NormDims& d, void* out, void* mean, void* rstd, const void* x,
                       const void* residual, void* sum, const void* weight, const void* bias,
                       double eps);
void layernorm_backward(const NormDims& d, void* dx, const void* dx_addend, void* dweight,
                        void* dbias, const void* dout, const void* x, const void* weight,
                        const void* mean, const void* rstd, bool accumulate);

void rmsnorm_forward(const NormDims& d, void* out, void* rstd, const void* x, const void* residual,
                     void* sum, const void* weight, double eps);
void rmsnorm_backward(const NormDims& d, void* dx, const void* dx_addend, void* dweight,
                      const void* dout, const void* x, const void* weight, const void* rstd,
                      bool accumulate);

}  // namespace fsdp::kernels::cpu
