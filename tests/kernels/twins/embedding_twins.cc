// Token and position embeddings and rotary embeddings (kernels/cuda/embedding.h, rope.h) against the
// CPU: the forward gather, the deterministic scatter-add backward at GPT-2 124M's shapes
// (skewed ids, a bucket too large for shared memory), bf16 tables into an f32 residual
// stream, and rope on strided q/k views of a fused projection, in place and into copies.
#include <vector>

#include "kernels/ops.h"
#include "runtime/core/error.h"
#include "tests/kernels/nn_test_util.h"
#include "tests/kernels/twin_harness.h"

namespace fsdp::testing {
namespace {

// Gathers copy (and add two rows of) the tables: a bf16 output rounds once (5e-3 of the
// scale), an f32 one only by f32's own rounding of the sum (1e-5).
Tolerance gather_tolerance(DType dt) {
  return dt == DType::bf16 ? Tolerance::scaled(5e-3, "one bf16 rounding of wte + wpe")
                           : Tolerance::scaled(1e-5, "f32 rounding of wte + wpe");
}

// Llama GQA's q and k (H = 32, Hkv = 8, D = 128, T = 2048, theta 500000) rotated in place as
// views of the fused qkv projection. Forward and inverse rotations each start from fresh
// data, so each comparison sees exactly one bf16 rounding of CUDA's result.
void rope_case(DType dt, bool inverse, int64_t position_offset) {
  const int64_t B = 2, T = 2048, H = 32, Hkv = 8, D = 128;
  const std::string from = position_offset ? str_cat(" from position ", position_offset) : "";
  const std::string name = str_cat("rope B", B, " T", T, " H", H, " Hkv", Hkv, " D", D, " ",
                                   dtype_name(dt), inverse ? " inverse" : " forward", from);
  register_twin({"embedding", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const Tensor qkv = s.random(Shape{B, T, (H + 2 * Hkv) * D}, dt, 5);  // (B, T, (H + 2 Hkv) D)
    const Tensor heads = qkv.view(Shape{B, T, H + 2 * Hkv, D});
    ops::rope_apply(ctx, heads.slice(2, 0, H), 500000.0, inverse, position_offset);        // q
    ops::rope_apply(ctx, heads.slice(2, H, H + Hkv), 500000.0, inverse, position_offset);  // k
    // The CPU angle is exact in double; CUDA reduces a double angle, then f32 sin/cos: ~1e-6
    // absolute on O(1) values. bf16 adds one rounding, half an ulp (2^-8) at |x| in [1, 2):
    // 5e-3 of the scale. v is untouched on both sides.
    s.output("qkv", qkv,
             dt == DType::bf16 ? Tolerance::scaled(5e-3, "one bf16 rounding of the rotation")
                               : Tolerance::scaled(1e-5, "f32 sin/cos of a double-reduced angle"));
  }});
}

// q and k rotated out of the fused projection into tensors of their own (the attention's
// path: one pass, no copy first), at Llama ~1B's head size (D = 64: 32-pair halves, 16-byte
// packs) and at a head size no pack divides (D = 6: one pair at a time). On each device the
// copies equal, bit for bit, the views rotated in place.
void rope_copy_case(DType dt, int64_t H, int64_t Hkv, int64_t D, int64_t B = 2, int64_t T = 512) {
  const std::string name = str_cat("rope B", B, " T", T, " H", H, " Hkv", Hkv, " D", D, " ",
                                   dtype_name(dt), " from the fused projection into copies");
  register_twin({"embedding", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const Tensor qkv = s.random(Shape{B, T, (H + 2 * Hkv) * D}, dt, 6);  // (B, T, (H + 2 Hkv) D)
    const Tensor heads = qkv.view(Shape{B, T, H + 2 * Hkv, D});
    const Tensor q = s.empty(Shape{B, T, H, D}, dt), k = s.empty(Shape{B, T, Hkv, D}, dt);
    ops::rope(ctx, q, heads.slice(2, 0, H), 500000.0, false);
    ops::rope(ctx, k, heads.slice(2, H, H + Hkv), 500000.0, false);
    const Tensor in_place = ops::clone(ctx, qkv);
    const Tensor in_place_heads = in_place.view(Shape{B, T, H + 2 * Hkv, D});
    ops::rope_apply(ctx, in_place_heads.slice(2, 0, H), 500000.0, false);
    ops::rope_apply(ctx, in_place_heads.slice(2, H, H + Hkv), 500000.0, false);
    s.expect(s.values(q) == s.values(ops::contiguous(ctx, in_place_heads.slice(2, 0, H))) &&
                 s.values(k) == s.values(ops::contiguous(ctx, in_place_heads.slice(2, H, H + Hkv))),
             "the copies equal the views rotated in place");
    // As rope_case: CUDA's f32 sin/cos of a double-reduced angle, one bf16 rounding.
    const Tolerance tol = dt == DType::bf16
                              ? Tolerance::scaled(5e-3, "one bf16 rounding of the rotation")
                              : Tolerance::scaled(1e-5, "f32 sin/cos of a double-reduced angle");
    s.output("q", q, tol);
    s.output("k", k, tol);
  }});
}

// GPT-2 124M: B = 4, T = 1024, C = 768, V = 50304. Skewed ids: a quarter of the positions hold
// token 13 (one huge bucket), the rest spread over a small range (many repeats) and the
// whole vocabulary.
void gpt2_embedding_case(DType dt) {
  const std::string name = str_cat("embedding B4 T1024 C768 V50304 skewed ids ", dtype_name(dt));
  register_twin({"embedding", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const int64_t B = 4, T = 1024, C = 768, V = 50304;
    std::vector<int32_t> ids(size_t(B * T), 0);
    const std::vector<double> u = uniform_values(B * T, 9, 0, 1);
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = u[i] < 0.25 ? 13 : u[i] < 0.6 ? int32_t(u[i] * 1000) : int32_t(u[i] * (V - 1));
    const Tensor idx = s.indices(ids, Shape{B, T});
    const Tensor wte = s.random(Shape{V, C}, dt, 10), wpe = s.random(Shape{T, C}, dt, 11);
    const Tensor out = s.empty(Shape{B, T, C}, dt);
    ops::embedding_forward(ctx, out, idx, wte, wpe);
    s.output("out", out, gather_tolerance(dt));

    const Tensor dout = s.random(Shape{B, T, C}, dt, 12);
    const Tensor dwte = s.full(Shape{V, C}, DType::f32, 0.25);
    const Tensor dwpe = s.full(Shape{T, C}, DType::f32, 0.25);
    ops::embedding_backward(ctx, dwte, dwpe, dout, idx);
    // Token 13's row sums ~1000 terms: f32 order differences stay near 1e-6 of the scale.
    s.output("dwte", dwte, Tolerance::scaled(1e-5, "f32 sums of ~1000 rows in another order"));
    s.output("dwpe", dwpe, Tolerance::scaled(1e-5, "f32 sums over B in another order"));
    const Tensor again = s.full(Shape{V, C}, DType::f32, 0.25);
    ops::embedding_backward(ctx, again, Tensor(), dout, idx);
    s.expect(s.values(again) == s.values(dwte), "dwte has the same bits when run again");
  }});
}

// A vocabulary-parallel shard (tensor parallelism over 2): rows [25152, 50304) of GPT-2's
// padded table, the same skewed ids, so about half the positions are another shard's (zero
// rows forward, no gradient backward) and token 13's large bucket is not this shard's.
void shard_case(DType dt) {
  const std::string name = str_cat("embedding shard [25152, 50304) of V50304 B4 T1024 C768 ",
                                   dtype_name(dt));
  register_twin({"embedding", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const int64_t B = 4, T = 1024, C = 768, V = 50304, begin = 25152, rows = V - begin;
    std::vector<int32_t> ids(size_t(B * T), 0);
    const std::vector<double> u = uniform_values(B * T, 19, 0, 1);
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = u[i] < 0.25 ? 13 : u[i] < 0.4 ? int32_t(begin + u[i] * 1000) : int32_t(u[i] * (V - 1));
    const Tensor idx = s.indices(ids, Shape{B, T});
    const ops::VocabShard shard{begin, V};
    const Tensor wte = s.random(Shape{rows, C}, dt, 20), wpe = s.random(Shape{T, C}, dt, 21);
    const Tensor out = s.empty(Shape{B, T, C}, dt);
    ops::embedding_forward(ctx, out, idx, wte, wpe, shard);
    s.output("out", out, gather_tolerance(dt));
    const Tensor dout = s.random(Shape{B, T, C}, dt, 22);
    const Tensor dwte = s.full(Shape{rows, C}, DType::f32, 0.25);
    ops::embedding_backward(ctx, dwte, Tensor(), dout, idx, shard);
    s.output("dwte", dwte, Tolerance::scaled(1e-5, "f32 sums of repeated rows in another order"));
  }});
}

// One token at 6000 of 8192 positions: a bucket too large for the shared-memory sort.
void large_bucket_case() {
  const std::string name = "embedding_backward B8 T1024 C64 V1000 one bucket of 6144 f32";
  register_twin({"embedding", name, [](TwinSide& s) {
    Context& ctx = s.ctx();
    std::vector<int32_t> ids(size_t(8192), 0);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = i % 4 == 3 ? int32_t(i % 977) : 5;
    const Tensor idx = s.indices(ids, Shape{8, 1024});
    const Tensor dout = s.random(Shape{8, 1024, 64}, DType::f32, 15);  // (B, T, C)
    const Tensor dwte = s.full(Shape{1000, 64}, DType::f32, 0.0);
    ops::embedding_backward(ctx, dwte, Tensor(), dout, idx);
    s.output("dwte", dwte, Tolerance::scaled(1e-5, "token 5 sums 6144 rows in another order"));
    const Tensor again = ops::zeros(ctx, Shape{1000, 64}, DType::f32);
    ops::embedding_backward(ctx, again, Tensor(), dout, idx);
    s.expect(s.values(again) == s.values(dwte), "dwte has the same bits when run again");
  }});
}

// Token + position embeddings of bf16 tables into an f32 residual stream.
void f32_stream_case() {
  register_twin({"embedding", "embedding B2 T64 C768 V1000 bf16 tables into f32", [](TwinSide& s) {
    Context& ctx = s.ctx();
    const int64_t B = 2, T = 64, C = 768, V = 1000;
    std::vector<int32_t> ids(size_t(B * T));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 7919) % V);
    const Tensor idx = s.indices(ids, Shape{B, T});
    const Tensor wte = s.random(Shape{V, C}, DType::bf16, 27);
    const Tensor wpe = s.random(Shape{T, C}, DType::bf16, 28);
    const Tensor out = s.empty(Shape{B, T, C}, DType::f32);
    ops::embedding_forward(ctx, out, idx, wte, wpe);
    s.output("out", out, Tolerance::exact("the sum of two bf16 values is exact in f32"));
    // A narrower output than the tables (bf16 beside f32 tables) is refused.
    bool refused = false;
    try {
      ops::embedding_forward(ctx, ops::empty(ctx, Shape{B, T, C}, DType::bf16), idx,
                             ops::cast(ctx, wte, DType::f32), Tensor());
    } catch (const DTypeError&) {
      refused = true;
    }
    s.expect(refused, "a bf16 output beside f32 tables is refused (DTypeError)");
  }});
}

void register_embedding_twins() {
  for (DType dt : {DType::bf16, DType::f32}) {
    for (bool inverse : {false, true}) rope_case(dt, inverse, 0);
  }
  // Rows after a key/value cache's (generation): the angle starts at the offset.
  rope_case(DType::f32, false, 4000);
  for (DType dt : {DType::bf16, DType::f32}) rope_copy_case(dt, 32, 8, 64);
  rope_copy_case(DType::bf16, 3, 1, 6);
  // 600000 rows of one 16-byte item each: more rows than one launch's grid covers (65535
  // blocks of 8 rows), so the kernel's loop over rows runs.
  rope_copy_case(DType::bf16, 1, 1, 16, 3, 200000);
  for (DType dt : {DType::bf16, DType::f32}) gpt2_embedding_case(dt);
  large_bucket_case();
  f32_stream_case();
  for (DType dt : {DType::bf16, DType::f32}) shard_case(dt);
}

}  // namespace
FSDP_REGISTER_TWINS(register_embedding_twins)
}  // namespace fsdp::testing
