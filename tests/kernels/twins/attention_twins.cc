// Our own causal grouped-query attention kernels (kernels/cuda/attention.h) against the CPU:
// bf16 training forward and backward with cuDNN switched off (the path of shapes cuDNN
// refuses), and attention over a key/value cache (generation, always our kernel), in bf16
// and f32.
#include "kernels/nn_ops.h"
#include "kernels/ops.h"
#include "runtime/core/error.h"
#include "tests/kernels/twin_harness.h"
#include "tests/kernels/twins/attention_case.h"

namespace fsdp::testing {
namespace {

// New queries (B, Tq, H, D) at positions [L - Tq, L) over the first L rows of a key/value
// cache (B, Lmax, Hkv, D), as generation runs it.
void with_cache_case(int64_t Tq, int64_t L, DType dt) {
  const int64_t B = 2, H = 6, Hkv = 3, D = 64, Lmax = 320;
  register_twin({"attention", str_cat("attention_with_cache B", B, " Tq", Tq, " L", L, " H", H,
                                      " Hkv", Hkv, " D", D, " ", dtype_name(dt)),
                 [=](TwinSide& s) {
                   const Tensor q = s.random(Shape{B, Tq, H, D}, dt, 3, -2, 2);
                   const Tensor k_cache = s.random(Shape{B, Lmax, Hkv, D}, dt, 4, -2, 2);
                   const Tensor v_cache = s.random(Shape{B, Lmax, Hkv, D}, dt, 5);
                   const Tensor out = s.empty(Shape{B, Tq, H, D}, dt);
                   ops::attention_with_cache(s.ctx(), out, q, k_cache.narrow(1, 0, L),
                                             v_cache.narrow(1, 0, L));
                   // As the training forward: a bf16 output (and bf16 probabilities) within
                   // 1e-2 of the scale; f32 exp and sums over up to L keys within 1e-4.
                   s.output("out", out,
                            dt == DType::bf16
                                ? Tolerance::scaled(1e-2, "bf16 probabilities and output")
                                : Tolerance::scaled(1e-4, "f32 exp and sums over up to L keys"));
                 }});
}

void register_attention_twins() {
  for (const AttentionShape& a : {kGpt2Attention, kLlamaAttention, kOddAttention}) {
    register_twin({"attention", a.name() + " bf16 without cuDNN", [a](TwinSide& s) {
      run_attention_twin(s, a, DType::bf16, false);
    }});
  }
  for (DType dt : {DType::bf16, DType::f32}) {
    with_cache_case(1, 300, dt);  // one new token after a long cache
    with_cache_case(7, 77, dt);   // a prompt's tail
  }
}

}  // namespace
FSDP_REGISTER_TWINS(register_attention_twins)
}  // namespace fsdp::testing
