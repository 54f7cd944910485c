// The causal attention twin case shared by the three CUDA attention families: our own
// kernels (attention), the f32 path through cuBLAS (attention_gemm) and cuDNN's fused
// kernels (cudnn_attention). Each runs forward and backward on q/k/v views into one fused
// projection, as the attention layer makes them.
#pragma once

#include <string>

#include "kernels/ops.h"
#include "runtime/core/error.h"
#include "tests/kernels/twin_harness.h"

namespace fsdp::testing {

struct AttentionShape {
  int64_t B, T, H, Hkv, D;
  std::string name() const { return str_cat("B", B, " T", T, " H", H, " Hkv", Hkv, " D", D); }
};

// GPT-2 124M; a Llama GQA shape; and one with the sequence and head size off every tile.
inline const AttentionShape kGpt2Attention{4, 1024, 12, 12, 64};
inline const AttentionShape kLlamaAttention{1, 512, 32, 8, 128};
inline const AttentionShape kOddAttention{2, 77, 6, 3, 40};

// The q, k and v views (B, T, H or Hkv, D) of a fused (B, T, (H + 2 Hkv) D) projection.
struct QkvViews {
  Tensor q, k, v;
};
inline QkvViews split_qkv(const Tensor& fused, const AttentionShape& a) {
  const Tensor heads = fused.view(Shape{a.B, a.T, a.H + 2 * a.Hkv, a.D});
  return {heads.slice(2, 0, a.H), heads.slice(2, a.H, a.H + a.Hkv),
          heads.slice(2, a.H + a.Hkv, a.H + 2 * a.Hkv)};
}

// Forward and backward on one side; `cudnn` selects CUDA's path (false forces our own
// kernels; f32 always runs through cuBLAS).
inline void run_attention_twin(TwinSide& s, const AttentionShape& a, DType dt, bool cudnn) {
  Context& ctx = s.ctx();
  ctx.extension<ops::KernelOptions>().use_cudnn_attention = cudnn;
  const Shape fused{a.B, a.T, (a.H + 2 * a.Hkv) * a.D};
  // Scores of O(1) after the 1/sqrt(D) scale: realistic, and the softmax is not one-hot.
  const Tensor qkv = s.random(fused, dt, 1, -2, 2);
  const QkvViews x = split_qkv(qkv, a);
  const Tensor out = s.empty(Shape{a.B, a.T, a.H, a.D}, dt);
  const Tensor lse = s.empty(Shape{a.B, a.H, a.T}, DType::f32);
  ops::attention_forward(ctx, out, lse, x.q, x.k, x.v);
  // bf16: the fused kernels round the probabilities to bf16 before P @ V and store the
  // output in bf16; errors of a few 2^-9 relative: 1e-2 of the output's scale. f32 (cuBLAS
  // matmuls around our softmax, f32 exp and sums over up to T keys): 1e-4.
  s.output("out", out,
           dt == DType::bf16
               ? Tolerance::scaled(1e-2, "probabilities rounded to bf16 before P @ V; bf16 output")
               : Tolerance::scaled(1e-4, "f32 exp and sums over up to T keys"));
  s.output("lse", lse, Tolerance::scaled(1e-4, "f32 log-sum-exp of O(1) scores, up to T terms"));

  const Tensor dout = s.random(Shape{a.B, a.T, a.H, a.D}, dt, 2);
  const Tensor dqkv = s.full(fused, dt, 7.0);  // garbage: must be overwritten
  const QkvViews d = split_qkv(dqkv, a);
  // Each side differentiates its own forward (CUDA's bf16 out and f32 lse).
  ops::attention_backward(ctx, d.q, d.k, d.v, dout, out, lse, x.q, x.k, x.v);
  // The backward rounds P and dS to bf16 inside the fused kernels and sums T terms per
  // element (H / Hkv heads for dk, dv): 2e-2 of the scale in bf16; 1e-4 in f32.
  const Tolerance grad =
      dt == DType::bf16
          ? Tolerance::scaled(2e-2, "P and dS rounded to bf16; sums of T terms (and H/Hkv heads)")
          : Tolerance::scaled(1e-4, "f32 sums of T terms (and H/Hkv heads)");
  s.output("dq", d.q, grad);
  s.output("dk", d.k, grad);
  s.output("dv", d.v, grad);
}

}  // namespace fsdp::testing
