// Causal grouped-query attention at the Tensor level (kernels/ops.h has the conventions):
// kernels/attention.cc routes it to kernels/cpu/attention.h, or on CUDA to cuDNN
// (kernels/cuda/cudnn_attention.h), cuBLAS matmuls (kernels/cuda/attention_gemm.h) or our
// own kernels (kernels/cuda/attention.h).
#pragma once

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp::ops {

// Per-context switches of how attention runs, for tests and benchmarks:
//   ctx.extension<ops::KernelOptions>().use_cudnn_attention = false;
struct KernelOptions {
  explicit KernelOptions(Context&) {}
  // CUDA attention through cuDNN's fused kernels where they support the shape and dtype;
  // false forces our own attention kernels everywhere.
  bool use_cudnn_attention = true;
};

// Causal scaled-dot-product attention with grouped-query heads. q (B, T, H, D),
// k and v (B, T, Hkv, D) (H % Hkv == 0), any strides for B, T, H with D contiguous (they
// are usually views into one fused qkv projection); out (B, T, H, D) contiguous;
// lse (B, H, T) f32 holds the softmax's log-sum-exp for the backward. scale = 1/sqrt(D)
// when 0. On CUDA, f32 runs as cuBLAS matmuls around a causal softmax (exact f32 at matmul
// speed; kernels/cuda/attention_gemm.h); bf16 uses cuDNN's fused attention (D a multiple of
// 8 up to 128, strides multiples of 8 elements, 16-byte aligned data), or our own kernel
// otherwise (any D up to 512, any strides) or when KernelOptions::use_cudnn_attention is
// false. k and v may hold L > T rows (a chunk of a longer sequence, as context parallelism
// splits it): the queries are then positions [L - T, L) and query t attends to keys
// 0 .. L - T + t; on CUDA our own kernels run it. causal = false lets every query see
// every key (a ring block whose keys all come before its queries): cuDNN in bf16, our own
// kernels in f32.
void attention_forward(Context& ctx, const Tensor& out, const Tensor& lse, const Tensor& q,
                       const Tensor& k, const Tensor& v, double scale = 0.0, bool causal = true);
// Attention of new queries over a key/value cache, for generation (forward only): q
// (B, Tq, H, D) holds the queries of positions [L - Tq, L); k and v (B, L, Hkv, D) the keys
// and values of positions [0, L), L >= Tq (usually views of the first L rows of a larger
// cache). Query t attends to keys 0 .. L - Tq + t. out (B, Tq, H, D) contiguous. Same
// stride rules as attention_forward; on CUDA always our own kernel (its one-warp-per-query
// loop is what decoding one token needs).
void attention_with_cache(Context& ctx, const Tensor& out, const Tensor& q, const Tensor& k,
                          const Tensor& v, double scale = 0.0);
// dq (B, T, H, D), dk and dv (B, L, Hkv, D) as k, same stride rules; overwritten.
void attention_backward(Context& ctx, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                        const Tensor& dout, const Tensor& out, const Tensor& lse,
                        const Tensor& q, const Tensor& k, const Tensor& v, double scale = 0.0, bool causal = true);

// Context parallelism's ring: merges a block's attention block_out (B, T, H, D) with its
// log-sum-exp block_lse (B, H, T) into the running out (B, T, H, D) and lse (B, H, T) (both
// of the statistics dtype: f32, f64 for f64; lse -inf and out 0 before the first block):
// lse' = log(exp(lse) + exp(block_lse)), out' = out e^(lse - lse') + block_out e^(block_lse - lse').
void attention_merge(Context& ctx, const Tensor& out, const Tensor& lse, const Tensor& block_out,
                     const Tensor& block_lse);

}  // namespace fsdp::ops
