// CUDA kernels: LayerNorm and RMSNorm (the twins of kernels/cpu/norm.h).
// Raw pointers, sizes and a stream; nothing here synchronizes with the host. Compute dtypes
// are bf16 and f32, computed and accumulated in f32; statistics (mean, rstd, lse, losses) are
// f32. Scratch memory is passed in by the caller (sizes from the *_workspace_bytes helpers),
// so every launch is asynchronous and allocation-free.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/basic.h"
#include "kernels/nn_shapes.h"
#include "kernels/scalar_math.h"

namespace fsdp::kernels::cuda {

// ---- norms: forward one warp per row; backward one block per group of rows, dweight/dbias
// partial sums per block, reduced in fixed order.
size_t norm_workspace_bytes(const NormDims& d);
// With residual and sum: sum = x + residual is stored and normalized (a fused residual add).
// dx = dx_addend + the norm's gradient; dx_addend null (overwrite), dx (accumulate) or another
// tensor of x's dtype.
void layernorm_forward(const NormDims& d, void* out, float* mean, float* rstd, const void* x,
                       const void* residual, void* sum, const void* weight, const void* bias,
                       double eps, stream_t stream);
void layernorm_backward(const NormDims& d, void* dx, const void* dx_addend, void* dweight,
                        void* dbias, const void* dout, const void* x, const void* weight,
                        const float* mean, const float* rstd, bool accumulate, void* workspace,
                        stream_t stream);
void rmsnorm_forward(const NormDims& d, void* out, float* rstd, const void* x,
                     const void* residual, void* sum, const void* weight, double eps,
                     stream_t stream);
void rmsnorm_backward(const NormDims& d, void* dx, const void* dx_addend, void* dweight,
                      const void* dout, const void* x, const void* weight, const float* rstd,
                      bool accumulate, void* workspace, stream_t stream);

}  // namespace fsdp::kernels::cuda
