// cuDNN's FP8 flash-attention graphs (Hopper): the operation graphs its runtime fusion engine
// recognizes as FP8 scaled-dot-product attention, forward and backward, built through the
// backend API. Every product reads FP8 operands and accumulates in f32; the f32 result is
// multiplied by its operands' descales, and what is stored in FP8 by its own scale.
//
// forward:  S = (Q K^T) * softmax_scale * dq * dk; causal mask; softmax with its
//           log-sum-exp (lse = max + log(sum exp)); P = softmax(S);
//           amax_S = max |P|; O = fp8(P * scale_S) V * ds * dv * scale_O; amax_O.
// backward: Delta = sum_D(dO * O) * ddO * dO_descale; P = exp(S - lse) (masked);
//           dV = fp8(P * scale_S)^T dO * ds * ddO * scale_dV;
//           dS = P (dO V^T * ddO * dv - Delta) * softmax_scale; amax_dS;
//           dQ = fp8(dS * scale_dS) K * dds * dk * scale_dQ; dK = fp8(dS * scale_dS)^T Q *
//           dds * dq * scale_dK; grouped-query heads summed per group. An output stored in
//           bf16 has a scale of 1.
#include "kernels/cuda/cudnn_attention_graph.h"

namespace fsdp::kernels::cuda::attention_graph {
namespace {

constexpr cudnnDataType_t kF32 = CUDNN_DATA_FLOAT;
constexpr cudnnDataType_t kBf16 = CUDNN_DATA_BFLOAT16;

cudnnDataType_t cudnn_type(Fp8Format f) {
  return f == Fp8Format::e4m3 ? CUDNN_DATA_FP8_E4M3 : CUDNN_DATA_FP8_E5M2;
}

// A graph under construction with the scalars it reads, each made once (one descriptor per
// uid: cuDNN expects a tensor used twice to be the same descriptor).
struct Fp8Graph {
  GraphBuilder& g;
  TensorRef scales[kFp8ScalarCount];
  TensorRef attn_scale;
  TensorRef softmax_scale() {
    if (!attn_scale.desc) attn_scale = g.scalar(kFp8AttnScale, kF32);
    return attn_scale;
  }
  TensorRef one_by_one(int64_t uid) { return g.tensor(uid, {1, 1, 1, 1}, {1, 1, 1, 1}, kF32); }
  TensorRef scale(Fp8AttentionScalar slot) {
    if (!scales[slot].desc) scales[slot] = one_by_one(kFp8Scale + slot);
    return scales[slot];
  }
  TensorRef amax(Fp8AttentionAmax slot) { return one_by_one(kFp8Amax + slot); }
  // y = x * scale (f32 unless `type` says otherwise; a real tensor when `into` is given).
  TensorRef mul(TensorRef x, TensorRef s, const Dims& dims, const Dims& strides,
                cudnnDataType_t type = kF32) {
    TensorRef y = g.virtual_tensor(dims, strides, type);
    g.pointwise(CUDNN_POINTWISE_MUL, x, s, y);
    return y;
  }
};

// c = a @ b, summed over each head group when c has fewer heads than a, times the two
// descales, stored times `scale_c` into `c` (FP8, or bf16 with a scale of 1: cuDNN's engine
// expects the scale's multiply either way); amax_c of it before the scale.
void scaled_matmul(Fp8Graph& f, TensorRef a, TensorRef b, const Dims& full, const Dims& full_strides,
                   bool group_sum, const Dims& dims, const Dims& strides, TensorRef descale_a,
                   TensorRef descale_b, TensorRef scale_c, TensorRef c, TensorRef amax_c) {
  GraphBuilder& g = f.g;
  TensorRef product = g.virtual_tensor(full, full_strides, kF32);
  g.matmul(a, b, product);
  if (group_sum) {
    TensorRef summed = g.virtual_tensor(dims, strides, kF32);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, product, summed);
    product = summed;
  }
  TensorRef x = f.mul(f.mul(product, descale_a, dims, strides), descale_b, dims, strides);
  g.pointwise(CUDNN_POINTWISE_MUL, x, scale_c, c);
  g.reduction(CUDNN_REDUCE_TENSOR_AMAX, x, amax_c);
}

// (Q K^T) * softmax_scale * dq * dk, causally masked: the scores (B, H, T, L) f32.
TensorRef scores(Fp8Graph& f, const AttentionDims& d, const Shapes& s, TensorRef q, TensorRef kt) {
  GraphBuilder& g = f.g;
  TensorRef raw = g.virtual_tensor(s.scores, s.scores_strides, kF32);
  g.matmul(q, kt, raw);
  TensorRef x = f.mul(raw, f.softmax_scale(), s.scores, s.scores_strides);
  x = f.mul(x, f.scale(kFp8DescaleQ), s.scores, s.scores_strides);
  x = f.mul(x, f.scale(kFp8DescaleK), s.scores, s.scores_strides);
  return causal_mask(g, d, s, x, g.scalar(kFp8NegInf, kF32), 0);
}

}  // namespace

std::unique_ptr<cudnn::Plan> fp8_forward_plan(cudnnHandle_t handle, const AttentionDims& d,
                                              const Fp8AttentionTypes& types) {
  GraphBuilder g(handle);
  Fp8Graph f{g, {}, {}};
  const Shapes s(d);
  const cudnnDataType_t in = cudnn_type(types.forward);
  TensorRef q = g.tensor(kFp8Q, bhtd(d, d.heads), strides_of(d.q), in);
  TensorRef kt = g.tensor(kFp8K, bhdl(d, d.kv_heads), transposed_strides(d.k), in);
  TensorRef v = g.tensor(kFp8V, bhld(d, d.kv_heads), strides_of(d.v), in);
  TensorRef o = g.tensor(kFp8O, bhtd(d, d.heads), strides_of(d.out), types.out_fp8 ? in : kBf16);
  TensorRef lse = g.tensor(kFp8Stats, s.rows, s.rows_strides, kF32);

  TensorRef p = softmax_with_stats(g, s, scores(f, d, s, q, kt), lse, kF32);
  g.reduction(CUDNN_REDUCE_TENSOR_AMAX, p, f.amax(kFp8AmaxS));

  // O = fp8(P * scale_S) @ V, descaled (and scaled again when stored in FP8).
  TensorRef p8 = f.mul(p, f.scale(kFp8ScaleS), s.scores, s.scores_strides, in);
  scaled_matmul(f, p8, v, s.full, s.full_strides, false, s.full, s.full_strides,
                f.scale(kFp8DescaleS), f.scale(kFp8DescaleV), f.scale(kFp8ScaleO), o,
                f.amax(kFp8AmaxO));
  return g.build();
}

std::unique_ptr<cudnn::Plan> fp8_backward_plan(cudnnHandle_t handle, const AttentionDims& d,
                                               const Fp8AttentionTypes& types) {
  GraphBuilder g(handle);
  Fp8Graph f{g, {}, {}};
  const Shapes s(d);
  const cudnnDataType_t in = cudnn_type(types.forward), grad = cudnn_type(types.backward);
  const cudnnDataType_t out_grad = types.grads_fp8 ? grad : kBf16;
  const bool grouped = d.heads != d.kv_heads;
  TensorRef q = g.tensor(kFp8Q, bhtd(d, d.heads), strides_of(d.q), in);
  TensorRef kt = g.tensor(kFp8K, bhdl(d, d.kv_heads), transposed_strides(d.k), in);
  TensorRef vt = g.tensor(kFp8V, bhdl(d, d.kv_heads), transposed_strides(d.v), in);
  TensorRef o = g.tensor(kFp8O, bhtd(d, d.heads), strides_of(d.out), in);
  TensorRef dout = g.tensor(kFp8DO, bhtd(d, d.heads), strides_of(d.dout), grad);
  TensorRef lse = g.tensor(kFp8Stats, s.rows, s.rows_strides, kF32);
  TensorRef dq = g.tensor(kFp8DQ, bhtd(d, d.heads), strides_of(d.dq), out_grad);
  TensorRef dk = g.tensor(kFp8DK, bhld(d, d.kv_heads), strides_of(d.dk), out_grad);
  TensorRef dv = g.tensor(kFp8DV, bhld(d, d.kv_heads), strides_of(d.dv), out_grad);

  // Delta = sum over D of dO * O, descaled: (B, H, T, 1).
  TensorRef prod = g.virtual_tensor(s.full, s.full_strides, kF32);
  g.pointwise(CUDNN_POINTWISE_MUL, dout, o, prod);
  TensorRef row_sum = g.virtual_tensor(s.rows, s.rows_strides, kF32);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, row_sum);
  TensorRef delta = f.mul(f.mul(row_sum, f.scale(kFp8DescaleDO), s.rows, s.rows_strides),
                          f.scale(kFp8DescaleO), s.rows, s.rows_strides);

  // P = exp(S - lse).
  TensorRef x = scores(f, d, s, q, kt);
  TensorRef shifted = g.virtual_tensor(s.scores, s.scores_strides, kF32);
  g.pointwise(CUDNN_POINTWISE_SUB, x, lse, shifted);
  TensorRef p = g.virtual_tensor(s.scores, s.scores_strides, kF32);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, {}, p);

  // dV = fp8(P * scale_S)^T dO.
  TensorRef p8 = f.mul(p, f.scale(kFp8ScaleS), s.scores, s.scores_strides, in);
  TensorRef p8t = g.virtual_tensor(s.scores, s.scores_t_strides, in);
  g.reshape(p8, p8t);
  const Dims kv_dims = bhld(d, d.kv_heads), kv_packed = {d.kv_heads * keys(d) * d.head_dim,
                                                         keys(d) * d.head_dim, d.head_dim, 1};
  scaled_matmul(f, p8t, dout, s.full_keys, s.full_keys_strides, grouped, kv_dims, kv_packed,
                f.scale(kFp8DescaleS), f.scale(kFp8DescaleDO), f.scale(kFp8ScaleDV), dv,
                f.amax(kFp8AmaxDV));

  // dS = P (dO V^T - Delta) * softmax_scale, then in FP8.
  TensorRef dp = g.virtual_tensor(s.scores, s.scores_strides, kF32);
  g.matmul(dout, vt, dp);
  dp = f.mul(f.mul(dp, f.scale(kFp8DescaleDO), s.scores, s.scores_strides),
             f.scale(kFp8DescaleV), s.scores, s.scores_strides);
  TensorRef centered = g.virtual_tensor(s.scores, s.scores_strides, kF32);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, delta, centered);
  TensorRef ds = f.mul(centered, p, s.scores, s.scores_strides);
  ds = f.mul(ds, f.softmax_scale(), s.scores, s.scores_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_AMAX, ds, f.amax(kFp8AmaxDS));
  TensorRef ds8 = f.mul(ds, f.scale(kFp8ScaleDS), s.scores, s.scores_strides, grad);

  // dQ = dS K.
  TensorRef k = g.virtual_tensor(bhld(d, d.kv_heads), strides_of(d.k), in);
  g.reshape(kt, k);
  scaled_matmul(f, ds8, k, s.full, s.full_strides, false, s.full, s.full_strides,
                f.scale(kFp8DescaleDS), f.scale(kFp8DescaleK), f.scale(kFp8ScaleDQ), dq,
                f.amax(kFp8AmaxDQ));

  // dK = dS^T Q.
  TensorRef ds8t = g.virtual_tensor(s.scores, s.scores_t_strides, grad);
  g.reshape(ds8, ds8t);
  scaled_matmul(f, ds8t, q, s.full_keys, s.full_keys_strides, grouped, kv_dims, kv_packed,
                f.scale(kFp8DescaleDS), f.scale(kFp8DescaleQ), f.scale(kFp8ScaleDK), dk,
                f.amax(kFp8AmaxDK));
  return g.build();
}

}  // namespace fsdp::kernels::cuda::attention_graph
