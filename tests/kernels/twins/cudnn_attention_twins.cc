// cuDNN's fused attention (kernels/cuda/cudnn_attention.h) against the CPU: bf16 forward and
// backward at GPT-2 124M's shape, a Llama GQA shape and an odd one (which cuDNN may refuse,
// falling back to our kernels), an unmasked block (context parallelism's ring), a chunk of
// queries after earlier keys (context parallelism's gathered keys), and checks that cuDNN
// really takes the GPT-2 problem, the unmasked block and the chunk's forward.
#include "kernels/ops.h"
#include "runtime/core/error.h"
#include "tests/kernels/twin_harness.h"
#include "tests/kernels/twins/attention_case.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/cudnn_attention.h"
#endif

namespace fsdp::testing {
namespace {

// On an H100/H200 with cuDNN >= 9 cuDNN must take the bf16 GPT-2 problem (q/k/v views of the
// fused projection, contiguous output): otherwise the cuDNN cases silently test our
// fallback.
void expect_cudnn_takes_gpt2(TwinSide& s) {
#if FSDP_WITH_CUDA
  kernels::AttentionDims d;
  d.batch = 4;
  d.seq = 1024;
  d.heads = d.kv_heads = 12;
  d.head_dim = 64;
  d.scale = 0.125;
  const int64_t row = 3 * 12 * 64;
  d.q = d.k = d.v = kernels::HeadStrides{1024 * row, row, 64};
  d.out = d.dout = d.dq = d.dk = d.dv = kernels::HeadStrides{1024 * 768, 768, 64};
  auto& cudnn = s.ctx().extension<kernels::cuda::CudnnAttention>();
  const bool forward = cudnn.supports(d, DType::bf16, false);
  s.expect(forward, "cuDNN takes the GPT-2 forward; refusal: " + cudnn.last_refusal());
  const bool backward = cudnn.supports(d, DType::bf16, true);
  s.expect(backward, "cuDNN takes the GPT-2 backward; refusal: " + cudnn.last_refusal());
  s.expect(!cudnn.supports(d, DType::f32, false), "f32 always takes our kernels");
#else
  (void)s;
#endif
}

// Context parallelism's blocks, bf16 through cuDNN, forward and backward against the CPU:
// Tq queries after L - Tq earlier keys, either an unmasked ring block (L = Tq, every query
// sees every key) or an all-gathered chunk under the causal mask aligned bottom-right (L >
// Tq). On an H100/H200 cuDNN must take the forward, and the unmasked block's backward; it
// refuses the chunk's backward graph (cudnnBackendFinalize), which our kernel then runs from
// cuDNN's output and log-sum-exp.
void block_case(int64_t Tq, int64_t L, bool causal) {
  const int64_t B = 2, H = 8, Hkv = 4, D = 64;
  const std::string name = causal ? str_cat("chunk B", B, " Tq", Tq, " after ", L - Tq, " keys")
                                  : str_cat("unmasked block B", B, " T", Tq);
  register_twin({"cudnn_attention", str_cat(name, " H", H, " Hkv", Hkv, " D", D, " bf16"),
                 [=](TwinSide& s) {
    Context& ctx = s.ctx();
    ctx.extension<ops::KernelOptions>().use_cudnn_attention = true;
    const uint32_t seed = causal ? 61 : 51;
    const Tensor q = s.random(Shape{B, Tq, H, D}, DType::bf16, seed, -2, 2);
    const Tensor k = s.random(Shape{B, L, Hkv, D}, DType::bf16, seed + 1, -2, 2);
    const Tensor v = s.random(Shape{B, L, Hkv, D}, DType::bf16, seed + 2);
    const Tensor out = s.empty(Shape{B, Tq, H, D}, DType::bf16);
    const Tensor lse = s.empty(Shape{B, H, Tq}, DType::f32);
    ops::attention_forward(ctx, out, lse, q, k, v, 0.0, causal);
    s.output("out", out, Tolerance::scaled(1e-2, "probabilities rounded to bf16 before P @ V; bf16 output"));
    s.output("lse", lse, Tolerance::scaled(1e-4, "f32 log-sum-exp"));
    const Tensor dout = s.random(Shape{B, Tq, H, D}, DType::bf16, seed + 3);
    const Tensor dq = s.empty(Shape{B, Tq, H, D}, DType::bf16);
    const Tensor dk = s.empty(Shape{B, L, Hkv, D}, DType::bf16), dv = s.empty(Shape{B, L, Hkv, D}, DType::bf16);
    ops::attention_backward(ctx, dq, dk, dv, dout, out, lse, q, k, v, 0.0, causal);
    const Tolerance grad = Tolerance::scaled(2e-2, "bf16 gradients of bf16 probabilities");
    s.output("dq", dq, grad);
    s.output("dk", dk, grad);
    s.output("dv", dv, grad);
#if FSDP_WITH_CUDA
    if (!s.is_reference()) {
      kernels::AttentionDims d;
      d.batch = B;
      d.seq = Tq;
      d.past = L - Tq;
      d.heads = H;
      d.kv_heads = Hkv;
      d.head_dim = D;
      d.scale = 0.125;
      d.causal = causal;
      d.q = d.out = d.dout = d.dq = kernels::HeadStrides{Tq * H * D, H * D, D};
      d.k = d.v = d.dk = d.dv = kernels::HeadStrides{L * Hkv * D, Hkv * D, D};
      auto& cudnn = ctx.extension<kernels::cuda::CudnnAttention>();
      s.expect(cudnn.supports(d, DType::bf16, false),
               "cuDNN takes the " + name + "'s forward; refusal: " + cudnn.last_refusal());
      if (!causal)
        s.expect(cudnn.supports(d, DType::bf16, true),
                 "cuDNN takes the " + name + "'s backward; refusal: " + cudnn.last_refusal());
    }
#endif
  }});
}

void register_cudnn_attention_twins() {
  block_case(128, 128, false);
  block_case(128, 384, true);
  for (const AttentionShape& a : {kGpt2Attention, kLlamaAttention, kOddAttention}) {
    const bool gpt2 = a.name() == kGpt2Attention.name();
    register_twin({"cudnn_attention", a.name() + " bf16", [a, gpt2](TwinSide& s) {
      run_attention_twin(s, a, DType::bf16, true);
      if (gpt2 && !s.is_reference()) expect_cudnn_takes_gpt2(s);
    }});
  }
}

}  // namespace
FSDP_REGISTER_TWINS(register_cudnn_attention_twins)
}  // namespace fsdp::testing
