// FP8 attention's scalar rules, shared by the CPU reference and the CUDA path: which tensors
// are FP8 in which format, the slots of the device array of scales cuDNN's FP8 graphs read
// and of the amaxes they write, and how every scale follows from the amaxes of the inputs.
//
// Q, K and V are quantized with the tensor-wise scale of their amax (fp8_scale_for_amax),
// dO likewise in the backward's format. The other tensors are quantized inside the fused
// kernels, before their amax is known, so their scales come from bounds that hold by
// construction and need no history:
//   P = softmax(S) lies in [0, 1]                         -> scale_S = scale for amax 1;
//   O = fp8(P) V: P's rounded values sum to at most 1 + 2^-4 (plus the subnormals' few
//     2^-10 steps), so O is within 9/8 of a convex combination of V's rows
//                                                         -> bound 9/8 |V|max;
//   dS = P (dP - Delta) * softmax_scale, |dP| <= D |dO|max |V|max and |Delta| <= D |dO|max
//     |O|max                                              -> bound 2 (9/8) D |dO|max |V|max
//                                                            softmax_scale;
// and the stored gradients likewise, each with the 9/8 of one rounding of its FP8 operand.
// A bound above the true amax only shifts the values down the format's range (e5m2's 32
// binades leave the gradients' magnitudes room); one below it would saturate them.
#pragma once

#include <cstdint>

#include "kernels/fp8_format.h"
#include "kernels/host_device.h"

namespace fsdp::kernels {

// Each quantized value is x * scale; its descale is 1 / scale.
struct Fp8AttentionTypes {
  Fp8Format forward = Fp8Format::e4m3;   // Q, K, V, P, and O when out_fp8
  Fp8Format backward = Fp8Format::e5m2;  // dO and dS, and dQ, dK, dV when grads_fp8
  bool out_fp8 = true;     // O stored as FP8 (x * scale_O); else bf16
  bool grads_fp8 = true;  // dQ, dK, dV stored as FP8 (x * their scales); else bf16
};

// Slots of the f32 array of scales an FP8 attention reads.
enum Fp8AttentionScalar : int {
  kFp8DescaleQ, kFp8DescaleK, kFp8DescaleV, kFp8ScaleS, kFp8DescaleS, kFp8ScaleO,
  kFp8DescaleO, kFp8DescaleDO, kFp8ScaleDS, kFp8DescaleDS, kFp8ScaleDQ, kFp8ScaleDK,
  kFp8ScaleDV, kFp8ScalarCount
};
// Slots of the f32 array of amaxes it writes (each the largest magnitude of the tensor
// before its scale): the forward the first two, the backward the rest.
enum Fp8AttentionAmax : int {
  kFp8AmaxS, kFp8AmaxO, kFp8AmaxDS, kFp8AmaxDQ, kFp8AmaxDK, kFp8AmaxDV, kFp8AmaxCount
};

// How far one rounding to FP8 can raise a magnitude (2^-4 in e4m3, 2^-3 in e5m2), and so a
// sum of rounded terms: the headroom of the bounds below (9/8, exact in f32).
constexpr float kFp8RoundingHeadroom = 1.125f;

// 1 / fp8_scale_for_amax: the same bits as fp8_quantize's scale_inv.
FSDP_HD float fp8_descale_for_amax(float amax, Fp8Format f) {
  return 1.0f / fp8_scale_for_amax(amax, f);
}

// Fills the forward's slots (amax_dout < 0) or every slot from the inputs' amaxes; keys is
// the number of keys L (the bound of dV's sum over queries is the queries' count T = L).
FSDP_HD void fp8_attention_scales(float* s, float amax_q, float amax_k, float amax_v,
                                  float amax_dout, int64_t head_dim, int64_t keys,
                                  float softmax_scale, Fp8AttentionTypes t) {
  s[kFp8DescaleQ] = fp8_descale_for_amax(amax_q, t.forward);
  s[kFp8DescaleK] = fp8_descale_for_amax(amax_k, t.forward);
  s[kFp8DescaleV] = fp8_descale_for_amax(amax_v, t.forward);
  s[kFp8ScaleS] = fp8_scale_for_amax(1.0f, t.forward);
  s[kFp8DescaleS] = fp8_descale_for_amax(1.0f, t.forward);
  // O's FP8 scale: the one its backward reads O with, whether the forward stored O in FP8
  // (scale_O) or in bf16 (scale 1, and the caller quantizes it for the backward).
  const float o_bound = kFp8RoundingHeadroom * amax_v;
  s[kFp8ScaleO] = t.out_fp8 ? fp8_scale_for_amax(o_bound, t.forward) : 1.0f;
  s[kFp8DescaleO] = fp8_descale_for_amax(o_bound, t.forward);
  if (amax_dout < 0.0f) return;
  s[kFp8DescaleDO] = fp8_descale_for_amax(amax_dout, t.backward);
  const float ds_bound = 2.0f * kFp8RoundingHeadroom * float(head_dim) * amax_dout * amax_v * softmax_scale;
  s[kFp8ScaleDS] = fp8_scale_for_amax(ds_bound, t.backward);
  s[kFp8DescaleDS] = fp8_descale_for_amax(ds_bound, t.backward);
  // Stored gradients (grads_fp8): dV = P^T dO sums at most L rows of dO; dQ = dS K and
  // dK = dS^T Q sum L (T) products of dS with K's (Q's) values. bf16 outputs: scale 1.
  const bool g = t.grads_fp8;
  const float h = kFp8RoundingHeadroom;
  s[kFp8ScaleDV] = g ? fp8_scale_for_amax(h * float(keys) * amax_dout, t.backward) : 1.0f;
  s[kFp8ScaleDQ] = g ? fp8_scale_for_amax(h * float(keys) * ds_bound * amax_k, t.backward) : 1.0f;
  s[kFp8ScaleDK] = g ? fp8_scale_for_amax(h * float(keys) * ds_bound * amax_q, t.backward) : 1.0f;
}

}  // namespace fsdp::kernels
