// Our own causal grouped-query attention kernels (kernels/cuda/attention.h) against the CPU:
// bf16 training forward and backward with cuDNN switched off (the path of shapes cuDNN
// refuses), attention over a key/value cache (generation, always our kernel), and context
// parallelism's pieces: a chunk of queries after earlier keys, an unmasked block, and the
// ring's merge of partial results, in bf16 and f32.
#include <cmath>

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

// A chunk of a longer sequence (context parallelism): queries (B, Tq, H, D) at positions
// [L - Tq, L) over keys (B, L, Hkv, D), forward and backward (our own kernels on CUDA; the
// cuDNN cases have cuDNN's).
void chunk_case(int64_t Tq, int64_t L, DType dt) {
  const int64_t B = 2, H = 6, Hkv = 3, D = 64;
  register_twin({"attention", str_cat("attention chunk B", B, " Tq", Tq, " after ", L - Tq,
                                      " keys H", H, " Hkv", Hkv, " D", D, " ", dtype_name(dt)),
                 [=](TwinSide& s) {
                   Context& ctx = s.ctx();
                   ctx.extension<ops::KernelOptions>().use_cudnn_attention = false;  // ours
                   const Tensor q = s.random(Shape{B, Tq, H, D}, dt, 6, -2, 2);
                   const Tensor k = s.random(Shape{B, L, Hkv, D}, dt, 7, -2, 2);
                   const Tensor v = s.random(Shape{B, L, Hkv, D}, dt, 8);
                   const Tensor out = s.empty(Shape{B, Tq, H, D}, dt);
                   const Tensor lse = s.empty(Shape{B, H, Tq}, DType::f32);
                   ops::attention_forward(ctx, out, lse, q, k, v);
                   const bool bf16 = dt == DType::bf16;
                   const Tolerance value = bf16 ? Tolerance::scaled(1e-2, "bf16 probabilities and output")
                                                : Tolerance::scaled(1e-4, "f32 exp and sums over up to L keys");
                   s.output("out", out, value);
                   s.output("lse", lse, Tolerance::scaled(1e-4, "f32 log-sum-exp"));
                   const Tensor dout = s.random(Shape{B, Tq, H, D}, dt, 9);
                   const Tensor dq = s.empty(Shape{B, Tq, H, D}, dt);
                   const Tensor dk = s.empty(Shape{B, L, Hkv, D}, dt), dv = s.empty(Shape{B, L, Hkv, D}, dt);
                   ops::attention_backward(ctx, dq, dk, dv, dout, out, lse, q, k, v);
                   const Tolerance grad = bf16 ? Tolerance::scaled(2e-2, "bf16 gradients of bf16 probabilities")
                                               : Tolerance::scaled(1e-4, "f32 sums over the keys or queries");
                   s.output("dq", dq, grad);
                   s.output("dk", dk, grad);
                   s.output("dv", dv, grad);
                 }});
}

// A ring block whose keys all come before its queries: no mask, forward and backward.
void unmasked_case(DType dt) {
  const int64_t B = 2, T = 96, H = 6, Hkv = 3, D = 64;
  register_twin({"attention", str_cat("attention unmasked block B", B, " T", T, " H", H, " Hkv",
                                      Hkv, " D", D, " ", dtype_name(dt)),
                 [=](TwinSide& s) {
                   Context& ctx = s.ctx();
                   ctx.extension<ops::KernelOptions>().use_cudnn_attention = false;  // ours
                   const Tensor q = s.random(Shape{B, T, H, D}, dt, 11, -2, 2);
                   const Tensor k = s.random(Shape{B, T, Hkv, D}, dt, 12, -2, 2);
                   const Tensor v = s.random(Shape{B, T, Hkv, D}, dt, 13);
                   const Tensor out = s.empty(Shape{B, T, H, D}, dt);
                   const Tensor lse = s.empty(Shape{B, H, T}, DType::f32);
                   ops::attention_forward(ctx, out, lse, q, k, v, 0.0, /*causal=*/false);
                   const bool bf16 = dt == DType::bf16;
                   s.output("out", out, bf16 ? Tolerance::scaled(1e-2, "bf16 probabilities and output")
                                             : Tolerance::scaled(1e-4, "f32 exp and sums over the keys"));
                   s.output("lse", lse, Tolerance::scaled(1e-4, "f32 log-sum-exp"));
                   const Tensor dout = s.random(Shape{B, T, H, D}, dt, 14);
                   const Tensor dq = s.empty(Shape{B, T, H, D}, dt);
                   const Tensor dk = s.empty(Shape{B, T, Hkv, D}, dt), dv = s.empty(Shape{B, T, Hkv, D}, dt);
                   ops::attention_backward(ctx, dq, dk, dv, dout, out, lse, q, k, v, 0.0, false);
                   const Tolerance grad = bf16 ? Tolerance::scaled(2e-2, "bf16 gradients of bf16 probabilities")
                                               : Tolerance::scaled(1e-4, "f32 sums over the keys or queries");
                   s.output("dq", dq, grad);
                   s.output("dk", dk, grad);
                   s.output("dv", dv, grad);
                 }});
}

// The ring's merge of a block into the running output, from a first block (nothing yet: lse
// -inf) and then a second.
void merge_case(DType dt) {
  const int64_t B = 2, T = 64, H = 6, D = 64;
  register_twin({"attention", str_cat("attention_merge B", B, " T", T, " H", H, " D", D, " ",
                                      dtype_name(dt)),
                 [=](TwinSide& s) {
                   Context& ctx = s.ctx();
                   const Tensor out = s.full(Shape{B, T, H, D}, DType::f32, 0.0);
                   const Tensor lse = s.full(Shape{B, H, T}, DType::f32, -INFINITY);
                   for (uint32_t block = 0; block < 2; ++block) {
                     const Tensor block_out = s.random(Shape{B, T, H, D}, dt, 20 + block);
                     const Tensor block_lse = s.random(Shape{B, H, T}, DType::f32, 30 + block, -3, 3);
                     ops::attention_merge(ctx, out, lse, block_out, block_lse);
                   }
                   s.output("out", out, Tolerance::scaled(1e-5, "f32 exp of log-sum-exp differences"));
                   s.output("lse", lse, Tolerance::scaled(1e-6, "f32 log of a sum of two exps"));
                 }});
}

void register_attention_twins() {
  for (DType dt : {DType::bf16, DType::f32}) {
    unmasked_case(dt);
    merge_case(dt);
  }
  for (DType dt : {DType::bf16, DType::f32}) chunk_case(64, 200, dt);
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
