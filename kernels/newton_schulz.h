// Muon's Newton-Schulz orthogonalization at the Tensor level (kernels/ops.h has the
// conventions): kernels/newton_schulz.cc routes it to kernels/cpu/newton_schulz.h or
// kernels/cuda/newton_schulz.h.
#pragma once

#include "kernels/nn_shapes.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp::ops {

using NewtonSchulzScalars = kernels::NewtonSchulzScalars;

// out = x orthogonalized, matrix by matrix: x and out (rows, cols) or (batch, rows, cols),
// contiguous, of one shape. Each matrix is divided by its Frobenius norm (at least s.eps),
// then s.steps quintic iterations X <- a X + (b A + c A^2) X, A = X X^T, run on its wide
// orientation. On the CPU in f64 for f64 x, else in f32; on CUDA in bf16 with f32
// accumulation (x f32 or bf16; f64 is refused there). out: any floating dtype.
void newton_schulz(Context& ctx, const Tensor& x, const Tensor& out, const NewtonSchulzScalars& s);

}  // namespace fsdp::ops
