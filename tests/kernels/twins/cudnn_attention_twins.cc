// cuDNN's fused attention (kernels/cuda/cudnn_attention.h) against the CPU: bf16 forward and
// backward at GPT-2 124M's shape, a Llama GQA shape and an odd one (which cuDNN may refuse,
// falling back to our kernels), and a check that cuDNN really takes the GPT-2 problem.
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

void register_cudnn_attention_twins() {
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
