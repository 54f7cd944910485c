// Dispatch of causal grouped-query attention (kernels/attention.h): the CPU reference, or on
// CUDA: f32 through cuBLAS matmuls (attention_gemm.h; exact f32 at matmul speed), bf16
// through cuDNN's fused attention when it supports the problem and KernelOptions allow it,
// and our own kernels otherwise.
#include "kernels/attention.h"

#include <cmath>

#include "kernels/checks.h"
#include "kernels/cpu/attention.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/attention_gemm.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/attention.h"
#endif

namespace fsdp::ops {
namespace {

using namespace detail;

// t (B, rows, heads, D) beside `like` (B, ., ., D); rows -1: like's.
void check_heads(Context& ctx, const Tensor& t, const Tensor& like, int64_t heads,
                 const char* what, int64_t rows = -1) {
  check_on_ctx(ctx, t, what);
  check_dtype(t, like.dtype(), what);
  head_strides(t, what);
  if (rows < 0) rows = like.size(1);
  FSDP_CHECK(t.size(0) == like.size(0) && t.size(1) == rows && t.size(2) == heads &&
                 t.size(3) == like.size(3),
             ShapeError, what, ": expected (", like.size(0), ", ", rows, ", ", heads, ", ",
             like.size(3), "), got ", t.str());
}

// Checks q, k, v, out, lse and fills the forward part of the problem description.
kernels::AttentionDims check_attention(Context& ctx, const Tensor& out, const Tensor& lse,
                                       const Tensor& q, const Tensor& k, const Tensor& v,
                                       double scale, bool causal, const char* what) {
  check_on_ctx(ctx, q, what);
  check_floating(q, what);
  kernels::AttentionDims d;
  d.q = head_strides(q, what);
  d.batch = q.size(0);
  d.seq = q.size(1);
  d.heads = q.size(2);
  d.head_dim = q.size(3);
  check_on_ctx(ctx, k, what);
  FSDP_CHECK(k.dim() == 4 && k.size(1) >= d.seq, ShapeError, what, ": k must be (B, L, Hkv, D) "
             "with L >= the ", d.seq, " queries, got ", k.str());
  d.kv_heads = k.size(2);
  // Keys before the first query (a chunk of a longer sequence: context parallelism).
  d.past = k.size(1) - d.seq;
  FSDP_CHECK(d.kv_heads > 0 && d.heads % d.kv_heads == 0, ShapeError, what, ": ", d.heads,
             " query heads cannot share ", d.kv_heads, " key/value heads evenly");
  check_heads(ctx, k, q, d.kv_heads, what, k.size(1));
  check_heads(ctx, v, q, d.kv_heads, what, k.size(1));
  d.k = head_strides(k, what);
  d.v = head_strides(v, what);
  check_dense(ctx, out, q.shape(), q.dtype(), what);
  d.out = head_strides(out, what);
  check_dense(ctx, lse, Shape{d.batch, d.heads, d.seq}, stats_dtype(q.dtype()), what);
  d.scale = scale != 0.0 ? scale : 1.0 / std::sqrt(double(d.head_dim));
  d.causal = causal;
  return d;
}

#if FSDP_WITH_CUDA
// cuDNN runs the problem when allowed and able (shape, dtype, 16-byte aligned data);
// otherwise our own kernels do.
bool use_cudnn(Context& ctx, const kernels::AttentionDims& d, DType dtype, bool backward,
               std::initializer_list<const void*> pointers) {
  if (!ctx.extension<KernelOptions>().use_cudnn_attention) return false;
  if (!kernels::cuda::CudnnAttention::aligned(pointers)) return false;
  return ctx.extension<kernels::cuda::CudnnAttention>().supports(d, dtype, backward);
}
#endif

}  // namespace

void attention_forward(Context& ctx, const Tensor& out, const Tensor& lse, const Tensor& q,
                       const Tensor& k, const Tensor& v, double scale, bool causal) {
  const kernels::AttentionDims d =
      check_attention(ctx, out, lse, q, k, v, scale, causal, "attention_forward");
  if (ctx.device().is_cpu()) {
    kernels::cpu::attention_forward(d, out.data_ptr(), lse.data_ptr(), q.data_ptr(), k.data_ptr(),
                                    v.data_ptr(), q.dtype());
    return;
  }
#if FSDP_WITH_CUDA
  float* lse_f = static_cast<float*>(lse.data_ptr());
  // The f32 matmul path takes queries and keys of one length under the mask; cuDNN (bf16)
  // also a chunk after earlier keys (context parallelism's gathered keys) and no mask.
  const bool f32 = q.dtype() == DType::f32;
  if (f32 && (d.past > 0 || !d.causal)) {
    kernels::cuda::attention_forward(d, out.data_ptr(), lse_f, q.data_ptr(), k.data_ptr(),
                                     v.data_ptr(), q.dtype(), ctx.stream().cuda_stream());
    return;
  }
  if (f32) {
    Tensor workspace = ctx.empty(
        Shape{int64_t(kernels::cuda::attention_gemm_workspace_bytes(d, false))}, DType::u8);
    kernels::cuda::attention_gemm_forward(
        ctx.extension<kernels::cuda::Blas>(), d, static_cast<float*>(out.data_ptr()), lse_f,
        static_cast<const float*>(q.data_ptr()), static_cast<const float*>(k.data_ptr()),
        static_cast<const float*>(v.data_ptr()), workspace.data_ptr(), ctx.stream().cuda_stream());
    return;
  }
  if (use_cudnn(ctx, d, q.dtype(), false,
                {out.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr()})) {
    ctx.extension<kernels::cuda::CudnnAttention>().forward(d, out.data_ptr(), lse_f, q.data_ptr(),
                                                           k.data_ptr(), v.data_ptr());
    return;
  }
  kernels::cuda::attention_forward(d, out.data_ptr(), lse_f, q.data_ptr(), k.data_ptr(),
                                   v.data_ptr(), q.dtype(), ctx.stream().cuda_stream());
#endif
}

void attention_with_cache(Context& ctx, const Tensor& out, const Tensor& q, const Tensor& k,
                          const Tensor& v, double scale) {
  const char* what = "attention_with_cache";
  check_on_ctx(ctx, q, what);
  check_floating(q, what);
  check_on_ctx(ctx, k, what);
  FSDP_CHECK(k.dim() == 4 && k.size(0) == q.size(0) && k.size(1) >= q.size(1) &&
                 k.size(3) == q.size(3),
             ShapeError, what, ": keys ", k.str(), " must be (B, L, Hkv, D) with L >= ", q.size(1),
             " for queries ", q.str());
  kernels::AttentionDims d;
  d.q = head_strides(q, what);
  d.batch = q.size(0);
  d.seq = q.size(1);
  d.heads = q.size(2);
  d.head_dim = q.size(3);
  d.kv_heads = k.size(2);
  d.past = k.size(1) - q.size(1);
  FSDP_CHECK(d.kv_heads > 0 && d.heads % d.kv_heads == 0, ShapeError, what, ": ", d.heads,
             " query heads cannot share ", d.kv_heads, " key/value heads evenly");
  check_dtype(k, q.dtype(), what);
  check_on_ctx(ctx, v, what);
  check_dtype(v, q.dtype(), what);
  FSDP_CHECK(v.shape() == k.shape(), ShapeError, what, ": values ", v.str(), " do not match keys ",
             k.str());
  d.k = head_strides(k, what);
  d.v = head_strides(v, what);
  check_dense(ctx, out, q.shape(), q.dtype(), what);
  d.out = head_strides(out, what);
  d.scale = scale != 0.0 ? scale : 1.0 / std::sqrt(double(d.head_dim));
  // The kernels also write each row's log-sum-exp, which only training's backward needs.
  const Tensor lse = ctx.empty(Shape{d.batch, d.heads, d.seq}, stats_dtype(q.dtype()));
  if (ctx.device().is_cpu()) {
    kernels::cpu::attention_forward(d, out.data_ptr(), lse.data_ptr(), q.data_ptr(), k.data_ptr(),
                                    v.data_ptr(), q.dtype());
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::attention_forward(d, out.data_ptr(), static_cast<float*>(lse.data_ptr()),
                                   q.data_ptr(), k.data_ptr(), v.data_ptr(), q.dtype(),
                                   ctx.stream().cuda_stream());
#endif
}

void attention_backward(Context& ctx, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                        const Tensor& dout, const Tensor& out, const Tensor& lse,
                        const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                        bool causal) {
  const char* what = "attention_backward";
  kernels::AttentionDims d = check_attention(ctx, out, lse, q, k, v, scale, causal, what);
  check_heads(ctx, dout, q, d.heads, what);
  check_heads(ctx, dq, q, d.heads, what);
  check_heads(ctx, dk, q, d.kv_heads, what, k.size(1));
  check_heads(ctx, dv, q, d.kv_heads, what, k.size(1));
  d.dout = head_strides(dout, what);
  d.dq = head_strides(dq, what);
  d.dk = head_strides(dk, what);
  d.dv = head_strides(dv, what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::attention_backward(d, dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                                     dout.data_ptr(), out.data_ptr(), lse.data_ptr(), q.data_ptr(),
                                     k.data_ptr(), v.data_ptr(), q.dtype());
    return;
  }
#if FSDP_WITH_CUDA
  const float* lse_f = static_cast<const float*>(lse.data_ptr());
  // In f32 only our own kernels take a chunk after earlier keys, or no mask.
  const bool own = q.dtype() == DType::f32 && (d.past > 0 || !d.causal);
  if (q.dtype() == DType::f32 && !own) {
    Tensor workspace = ctx.empty(
        Shape{int64_t(kernels::cuda::attention_gemm_workspace_bytes(d, true))}, DType::u8);
    auto f32 = [](const Tensor& t) { return static_cast<float*>(t.data_ptr()); };
    kernels::cuda::attention_gemm_backward(ctx.extension<kernels::cuda::Blas>(), d, f32(dq),
                                           f32(dk), f32(dv), f32(dout), f32(out), lse_f, f32(q),
                                           f32(k), f32(v), workspace.data_ptr(),
                                           ctx.stream().cuda_stream());
    return;
  }
  if (!own && use_cudnn(ctx, d, q.dtype(), true,
                {dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), dout.data_ptr(), out.data_ptr(),
                 q.data_ptr(), k.data_ptr(), v.data_ptr()})) {
    ctx.extension<kernels::cuda::CudnnAttention>().backward(
        d, dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), dout.data_ptr(), out.data_ptr(), lse_f,
        q.data_ptr(), k.data_ptr(), v.data_ptr());
    return;
  }
  Tensor workspace = ctx.empty(
      Shape{int64_t(kernels::cuda::attention_backward_workspace_bytes(d))}, DType::u8);
  kernels::cuda::attention_backward(d, dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                                    dout.data_ptr(), out.data_ptr(), lse_f, q.data_ptr(),
                                    k.data_ptr(), v.data_ptr(), q.dtype(), workspace.data_ptr(),
                                    ctx.stream().cuda_stream());
#endif
}

void attention_merge(Context& ctx, const Tensor& out, const Tensor& lse, const Tensor& block_out,
                     const Tensor& block_lse) {
  const char* what = "attention_merge";
  check_on_ctx(ctx, block_out, what);
  check_floating(block_out, what);
  check_contiguous(block_out, what);
  FSDP_CHECK(block_out.dim() == 4, ShapeError, what, ": block_out must be (B, T, H, D), got ",
             block_out.str());
  const int64_t b = block_out.size(0), t = block_out.size(1), h = block_out.size(2),
                d = block_out.size(3);
  const DType sd = stats_dtype(block_out.dtype());
  check_dense(ctx, out, block_out.shape(), sd, what);
  check_dense(ctx, lse, Shape{b, h, t}, sd, what);
  check_dense(ctx, block_lse, Shape{b, h, t}, sd, what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::attention_merge(b, t, h, d, out.data_ptr(), lse.data_ptr(), block_out.data_ptr(),
                                  block_lse.data_ptr(), block_out.dtype());
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::attention_merge(b, t, h, d, static_cast<float*>(out.data_ptr()),
                                 static_cast<float*>(lse.data_ptr()), block_out.data_ptr(),
                                 static_cast<const float*>(block_lse.data_ptr()), block_out.dtype(),
                                 ctx.stream().cuda_stream());
#endif
}

}  // namespace fsdp::ops
