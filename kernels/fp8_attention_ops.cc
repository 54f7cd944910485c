// Dispatch of FP8 attention (kernels/fp8_attention_ops.h).
#include "kernels/fp8_attention_ops.h"

#include <cmath>

#include "kernels/checks.h"
#include "kernels/cpu/fp8_attention.h"
#include "kernels/fp8_ops.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/fp8_attention.h"
#endif

namespace fsdp::ops {
namespace {

using namespace detail;

// t (B, rows, heads, D) of `dtype` with a unit stride over D.
kernels::HeadStrides check_heads(Context& ctx, const Tensor& t, int64_t b, int64_t rows,
                                 int64_t heads, int64_t dim, DType dtype, const char* what) {
  check_on_ctx(ctx, t, what);
  check_dtype(t, dtype, what);
  FSDP_CHECK(t.dim() == 4 && t.size(0) == b && t.size(1) == rows && t.size(2) == heads &&
                 t.size(3) == dim,
             ShapeError, what, ": expected (", b, ", ", rows, ", ", heads, ", ", dim, "), got ",
             t.str());
  return head_strides(t, what);
}

DType stored_dtype(bool fp8) { return fp8 ? DType::u8 : DType::bf16; }

// The problem of q, k, v (and out, lse), checked.
kernels::AttentionDims check_fp8_attention(Context& ctx, const Tensor& out, const Tensor& lse,
                                           const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& scales, const Tensor& amaxes,
                                           const Fp8AttentionTypes& types, double softmax_scale,
                                           const char* what) {
  check_on_ctx(ctx, q, what);
  FSDP_CHECK(q.dim() == 4, ShapeError, what, ": q must be (B, T, H, D), got ", q.str());
  kernels::AttentionDims d;
  d.batch = q.size(0);
  d.seq = q.size(1);
  d.heads = q.size(2);
  d.head_dim = q.size(3);
  FSDP_CHECK(k.dim() == 4 && k.size(2) > 0 && d.heads % k.size(2) == 0, ShapeError, what,
             ": k must be (B, T, Hkv, D) with Hkv dividing ", d.heads, ", got ", k.str());
  d.kv_heads = k.size(2);
  d.q = check_heads(ctx, q, d.batch, d.seq, d.heads, d.head_dim, DType::u8, what);
  d.k = check_heads(ctx, k, d.batch, d.seq, d.kv_heads, d.head_dim, DType::u8, what);
  d.v = check_heads(ctx, v, d.batch, d.seq, d.kv_heads, d.head_dim, DType::u8, what);
  d.out = check_heads(ctx, out, d.batch, d.seq, d.heads, d.head_dim, stored_dtype(types.out_fp8), what);
  check_dense(ctx, lse, Shape{d.batch, d.heads, d.seq}, DType::f32, what);
  check_dense(ctx, scales, Shape{kernels::kFp8ScalarCount}, DType::f32, what);
  check_dense(ctx, amaxes, Shape{kernels::kFp8AmaxCount}, DType::f32, what);
  d.scale = softmax_scale != 0.0 ? softmax_scale : 1.0 / std::sqrt(double(d.head_dim));
  d.causal = true;
  return d;
}

const uint8_t* bytes(const Tensor& t) { return static_cast<const uint8_t*>(t.data_ptr()); }
float* floats(const Tensor& t) { return static_cast<float*>(t.data_ptr()); }

}  // namespace

bool fp8_attention_supported(Context& ctx, const Shape& q, int64_t kv_heads,
                             const Fp8AttentionTypes& types, std::string* why) {
  auto refuse = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  if (q.rank() != 4 || kv_heads <= 0 || q[2] % kv_heads != 0)
    return refuse("FP8 attention needs q (B, T, H, D) with H a multiple of the key/value heads");
  if (!fp8_available(ctx, why)) return false;
  if (ctx.device().is_cpu()) return true;
#if FSDP_WITH_CUDA
  // The problem as the training path lays it out: q, k, v, out, dout and the gradients each
  // contiguous (B, T, heads, D).
  kernels::AttentionDims d;
  d.batch = q[0];
  d.seq = q[1];
  d.heads = q[2];
  d.kv_heads = kv_heads;
  d.head_dim = q[3];
  d.scale = 1.0 / std::sqrt(double(d.head_dim));
  const kernels::HeadStrides wide{d.seq * d.heads * d.head_dim, d.heads * d.head_dim, d.head_dim};
  const kernels::HeadStrides narrow{d.seq * kv_heads * d.head_dim, kv_heads * d.head_dim, d.head_dim};
  d.q = d.out = d.dout = d.dq = wide;
  d.k = d.v = d.dk = d.dv = narrow;
  auto& cudnn = ctx.extension<kernels::cuda::CudnnAttention>();
  for (bool backward : {false, true})
    if (!cudnn.supports_fp8(d, types, backward)) return refuse(cudnn.last_refusal());
  return true;
#else
  return refuse("built without CUDA");
#endif
}

void fp8_attention_scales(Context& ctx, const Tensor& scales, const Tensor& amax_q,
                          const Tensor& amax_k, const Tensor& amax_v, const Tensor& amax_dout,
                          int64_t head_dim, int64_t keys, const Fp8AttentionTypes& types,
                          double softmax_scale) {
  const char* what = "fp8_attention_scales";
  check_dense(ctx, scales, Shape{kernels::kFp8ScalarCount}, DType::f32, what);
  for (const Tensor* a : {&amax_q, &amax_k, &amax_v})
    check_dense(ctx, *a, Shape{1}, DType::f32, what);
  if (amax_dout.defined()) check_dense(ctx, amax_dout, Shape{1}, DType::f32, what);
  FSDP_CHECK(head_dim > 0 && keys > 0, ShapeError, what, ": head_dim ", head_dim, ", keys ", keys);
  const float scale = float(softmax_scale != 0.0 ? softmax_scale : 1.0 / std::sqrt(double(head_dim)));
  if (ctx.device().is_cpu()) {
    kernels::fp8_attention_scales(floats(scales), *floats(amax_q), *floats(amax_k),
                                  *floats(amax_v), amax_dout.defined() ? *floats(amax_dout) : -1.0f,
                                  head_dim, keys, scale, types);
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::fp8_attention_scales(floats(scales), floats(amax_q), floats(amax_k), floats(amax_v),
                                      amax_dout.defined() ? floats(amax_dout) : nullptr, head_dim,
                                      keys, scale, types, ctx.stream().cuda_stream());
#endif
}

void attention_forward_fp8(Context& ctx, const Tensor& out, const Tensor& lse, const Tensor& q,
                           const Tensor& k, const Tensor& v, const Tensor& scales,
                           const Tensor& amaxes, const Fp8AttentionTypes& types,
                           double softmax_scale) {
  const kernels::AttentionDims d = check_fp8_attention(ctx, out, lse, q, k, v, scales, amaxes,
                                                       types, softmax_scale, "attention_forward_fp8");
  if (ctx.device().is_cpu()) {
    kernels::cpu::attention_forward_fp8(d, types, out.data_ptr(), floats(lse), bytes(q), bytes(k),
                                        bytes(v), floats(scales), floats(amaxes));
    return;
  }
#if FSDP_WITH_CUDA
  ctx.extension<kernels::cuda::CudnnAttention>().forward_fp8(
      d, types, out.data_ptr(), floats(lse), q.data_ptr(), k.data_ptr(), v.data_ptr(),
      floats(scales), floats(amaxes));
#endif
}

void attention_backward_fp8(Context& ctx, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                            const Tensor& dout, const Tensor& out, const Tensor& lse,
                            const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& scales, const Tensor& amaxes,
                            const Fp8AttentionTypes& types, double softmax_scale) {
  const char* what = "attention_backward_fp8";
  Fp8AttentionTypes stored = types;
  stored.out_fp8 = true;  // the backward reads O as FP8
  kernels::AttentionDims d =
      check_fp8_attention(ctx, out, lse, q, k, v, scales, amaxes, stored, softmax_scale, what);
  const DType grad = stored_dtype(types.grads_fp8);
  d.dout = check_heads(ctx, dout, d.batch, d.seq, d.heads, d.head_dim, DType::u8, what);
  d.dq = check_heads(ctx, dq, d.batch, d.seq, d.heads, d.head_dim, grad, what);
  d.dk = check_heads(ctx, dk, d.batch, d.seq, d.kv_heads, d.head_dim, grad, what);
  d.dv = check_heads(ctx, dv, d.batch, d.seq, d.kv_heads, d.head_dim, grad, what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::attention_backward_fp8(d, types, dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                                         bytes(dout), bytes(out), floats(lse), bytes(q), bytes(k),
                                         bytes(v), floats(scales), floats(amaxes));
    return;
  }
#if FSDP_WITH_CUDA
  ctx.extension<kernels::cuda::CudnnAttention>().backward_fp8(
      d, types, dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), dout.data_ptr(), out.data_ptr(),
      floats(lse), q.data_ptr(), k.data_ptr(), v.data_ptr(), floats(scales), floats(amaxes));
#endif
}

}  // namespace fsdp::ops
