// Newton-Schulz orthogonalization for Muon on CUDA: the iteration's products in bf16 with
// f32 accumulation (cuBLASLt, batched over the matrices), as PyTorch's Muon computes them.
// The twin of kernels/cpu/newton_schulz.h.
#pragma once

#include <cstddef>

#include "kernels/cuda/basic.h"
#include "kernels/cuda/matmul.h"
#include "kernels/nn_shapes.h"

namespace fsdp::kernels::cuda {

// Bytes of scratch newton_schulz needs for these matrices.
size_t newton_schulz_workspace(const NewtonSchulzDims& d);

// out (batch, rows, cols) = each matrix of x orthogonalized. x: f32 or bf16, rounded to bf16
// first (its norm is the rounded matrix's); out: f32 or bf16. `workspace` holds
// newton_schulz_workspace(d) bytes.
void newton_schulz(Blas& blas, const NewtonSchulzDims& d, const void* x, DType x_dtype, void* out,
                   DType out_dtype, const NewtonSchulzScalars& s, void* workspace, stream_t stream);

}  // namespace fsdp::kernels::cuda
