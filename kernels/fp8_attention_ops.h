// FP8 attention at the Tensor level (kernels/fp8_attention.h has the formats, the scale
// slots and the rules): cuDNN's FP8 flash-attention graphs on a Hopper GPU; on the CPU the
// simulation of kernels/cpu/fp8_attention.h (tests). Training keeps bf16 attention: with
// cuDNN 9.19 these graphs take head size 128 only and are slower than bf16's there
// (`bench fp8-attention`, docs/PERFORMANCE.md "FP8 attention").
#pragma once

#include <string>

#include "kernels/fp8_attention.h"
#include "kernels/nn_ops.h"

namespace fsdp::ops {

using Fp8AttentionTypes = kernels::Fp8AttentionTypes;

// Whether ctx's device runs FP8 attention for q (B, T, H, D) beside kv_heads key/value
// heads with these types, forward and backward (the CPU's simulation: always, for causal
// shapes). When not, *why says so.
bool fp8_attention_supported(Context& ctx, const Shape& q, int64_t kv_heads,
                             const Fp8AttentionTypes& types, std::string* why = nullptr);

// scales (kFp8ScalarCount) f32 = kernels::fp8_attention_scales of the amaxes (1) f32 of q,
// k, v and dout (undefined: the forward's slots only); softmax_scale 0: 1 / sqrt(head_dim).
void fp8_attention_scales(Context& ctx, const Tensor& scales, const Tensor& amax_q,
                          const Tensor& amax_k, const Tensor& amax_v, const Tensor& amax_dout,
                          int64_t head_dim, int64_t keys, const Fp8AttentionTypes& types,
                          double softmax_scale = 0);

// Causal FP8 attention: q (B, T, H, D), k, v (B, T, Hkv, D) u8 FP8 bytes (types.forward)
// with unit stride over D; out (B, T, H, D) u8 (types.out_fp8) or bf16; lse (B, H, T) f32;
// scales from fp8_attention_scales; amaxes (kFp8AmaxCount) f32 receives its slots.
void attention_forward_fp8(Context& ctx, const Tensor& out, const Tensor& lse, const Tensor& q,
                           const Tensor& k, const Tensor& v, const Tensor& scales,
                           const Tensor& amaxes, const Fp8AttentionTypes& types,
                           double softmax_scale = 0);
// dout (B, T, H, D) u8 (types.backward), out u8 as the forward stored it; dq, dk, dv bf16
// (u8 when types.grads_fp8), overwritten.
void attention_backward_fp8(Context& ctx, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                            const Tensor& dout, const Tensor& out, const Tensor& lse,
                            const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& scales, const Tensor& amaxes,
                            const Fp8AttentionTypes& types, double softmax_scale = 0);

}  // namespace fsdp::ops
