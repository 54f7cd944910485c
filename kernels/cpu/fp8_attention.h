// The CPU simulation of cuDNN's FP8 attention (kernels/fp8_attention.h, the graphs of
// kernels/cuda/cudnn_fp8_attention.cu): the same quantization points (Q, K, V, O and dO as
// given bytes; P and dS rounded to FP8 at their scales inside) in f32 arithmetic with double
// sums, for tests of the training path on CPU ranks and as the GPU's reference. The products'
// summation order differs from the tensor cores', so the two agree to rounding, not bits.
#pragma once

#include "kernels/fp8_attention.h"
#include "kernels/nn_shapes.h"

namespace fsdp::kernels::cpu {

// q, k, v (and out when types.out_fp8) FP8 bytes at d's strides; out otherwise bf16; lse
// (B, H, T) f32; scales (kFp8ScalarCount), amaxes (kFp8AmaxCount) f32. d causal, past 0.
void attention_forward_fp8(const AttentionDims& d, const Fp8AttentionTypes& types, void* out,
                           float* lse, const uint8_t* q, const uint8_t* k, const uint8_t* v,
                           const float* scales, float* amaxes);
// dout and out FP8 bytes; dq, dk, dv bf16 (FP8 bytes when types.grads_fp8), overwritten.
void attention_backward_fp8(const AttentionDims& d, const Fp8AttentionTypes& types, void* dq,
                            void* dk, void* dv, const uint8_t* dout, const uint8_t* out,
                            const float* lse, const uint8_t* q, const uint8_t* k,
                            const uint8_t* v, const float* scales, float* amaxes);

}  // namespace fsdp::kernels::cpu
