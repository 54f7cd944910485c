// f32 causal attention through cuBLAS matmuls around our softmax
// (kernels/cuda/attention_gemm.h, every f32 attention on CUDA) against the CPU: forward and
// backward at GPT-2 124M's shape, a Llama GQA shape and an odd one.
#include "tests/kernels/twin_harness.h"
#include "tests/kernels/twins/attention_case.h"

namespace fsdp::testing {
namespace {

void register_attention_gemm_twins() {
  for (const AttentionShape& a : {kGpt2Attention, kLlamaAttention, kOddAttention}) {
    // cuDNN has no f32: the switch does not matter, f32 always takes the cuBLAS path.
    register_twin({"attention_gemm", a.name() + " f32", [a](TwinSide& s) {
      run_attention_twin(s, a, DType::f32, false);
    }});
  }
}

}  // namespace
FSDP_REGISTER_TWINS(register_attention_gemm_twins)
}  // namespace fsdp::testing
