// CPU Newton-Schulz orthogonalization for Muon (the twin of kernels/cuda/newton_schulz.h).
#pragma once

#include "kernels/nn_shapes.h"
#include "runtime/core/dtype.h"

namespace fsdp::kernels::cpu {

// out (batch, rows, cols) = each matrix of x orthogonalized (NewtonSchulzDims). x and out are
// any floating type; the iteration computes in f64 when x is f64, else in f32 (the products
// of kernels/cpu/matmul.h, each epilogue in double).
void newton_schulz(const NewtonSchulzDims& d, const void* x, DType x_dtype, void* out,
                   DType out_dtype, const NewtonSchulzScalars& s);

}  // namespace fsdp::kernels::cpu
