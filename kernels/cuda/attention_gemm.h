// Causal grouped-query attention in f32 through cuBLAS matmuls, for exact f32 training at
// matmul speed (cuDNN's fused attention has no f32; the warp-per-row kernels of
// attention.cu are far slower). q, k and v are first packed head-major (B, H, T, D) (k and v
// repeated over the heads that share them), then each (b, h) problem runs as batched
// matmuls with the (T, T) scores in a scratch buffer, a chunk of problems at a time:
//
//   forward:  S = scale q k^T; P = causal softmax(S) (and lse); out = P v
//   backward: S and P again from q, k and lse; dv = P^T dout; dP = dout v^T;
//             dS = P (dP - delta), delta = rowsum(dout * out); dq = scale dS k;
//             dk = scale dS^T q; dk and dv summed over the heads that share a kv head.
//
// Its CPU twin is kernels::cpu::attention_forward/backward (the GPU tests compare them).
#pragma once

#include <cstddef>

#include "kernels/cuda/matmul.h"
#include "kernels/nn_shapes.h"
#include "kernels/cuda/basic.h"

namespace fsdp::kernels::cuda {

// Workspace bytes of a forward (backward: true) for these dims.
size_t attention_gemm_workspace_bytes(const AttentionDims& d, bool backward);

// f32 only; lse (B, H, T). `blas` must queue on `stream` (its context's stream).
void attention_gemm_forward(Blas& blas, const AttentionDims& d, float* out, float* lse,
                            const float* q, const float* k, const float* v, void* workspace,
                            stream_t stream);
void attention_gemm_backward(Blas& blas, const AttentionDims& d, float* dq, float* dk, float* dv,
                             const float* dout, const float* out, const float* lse,
                             const float* q, const float* k, const float* v, void* workspace,
                             stream_t stream);

}  // namespace fsdp::kernels::cuda
