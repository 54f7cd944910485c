// cuBLASLt matmuls (kernels/cuda/matmul.h) against the CPU matmul: every transpose, bf16 and
// f32, GPT-2 124M's projection shapes, the bias and GELU epilogues (forward and the fused
// GELU gradient), weight and bias gradients in one matmul (BGRADB), f32 accumulation of bf16
// products, batched problems, and the plan cache.
#include <algorithm>

#include "kernels/ops.h"
#include "runtime/core/error.h"
#include "tests/kernels/twin_harness.h"
#include "tests/kernels/twins/timed_matmuls.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/matmul.h"
#endif

namespace fsdp::testing {
namespace {

// Relative to the output's scale. A bf16 output: one rounding of 2^-9 relative per element,
// plus f32 accumulation-order differences (~1e-6): 5e-3 holds with margin. An f32 output:
// both sides accumulate in f32 in different orders, sqrt(K) * 2^-24 relative: 2e-5.
Tolerance product_tolerance(DType out) {
  return out == DType::bf16
             ? Tolerance::scaled(5e-3, "one bf16 rounding of the output")
             : Tolerance::scaled(2e-5, "f32 accumulation in another order, sqrt(K) * 2^-24");
}
// With GELU applied: cuBLASLt's GELU is the tanh form like ours; the f32 tanh of each side
// differ by ~1e-6 of the scale, which the bf16 bound covers and the f32 one must allow.
Tolerance gelu_tolerance(DType out) {
  return out == DType::bf16
             ? product_tolerance(out)
             : Tolerance::scaled(2e-5, "f32 accumulation order; f32 tanh ~1e-6 apart");
}

// op(x)'s operand: (rows, cols), or (cols, rows) when transposed.
Shape operand(int64_t rows, int64_t cols, bool trans) {
  return trans ? Shape{cols, rows} : Shape{rows, cols};
}

void matmul_case(int64_t m, int64_t n, int64_t k, DType dt, bool ta, bool tb) {
  const std::string name = str_cat("matmul ", m, "x", n, "x", k, " ", dtype_name(dt),
                                   ta ? " ta" : "", tb ? " tb" : "");
  register_twin({"matmul", name, [=](TwinSide& s) {
    const Tensor a = s.random(operand(m, k, ta), dt, 1);  // op(a) (M, K)
    const Tensor b = s.random(operand(k, n, tb), dt, 2);  // op(b) (K, N)
    const Tensor out = s.empty(Shape{m, n}, dt);          // (M, N)
    ops::matmul(s.ctx(), out, a, b, ta, tb);
    s.output("out", out, product_tolerance(dt));
  }});
}

// A linear layer's forward with its epilogues: x (M, K) @ w^T, w (N, K) the Linear weight.
// n = 3072 runs cuBLASLt's GELU_AUX_BIAS; n = 100 (not a multiple of 8) our fallback.
void epilogue_case(int64_t n, DType dt) {
  const std::string name = str_cat("matmul bias+gelu 512x", n, "x768 ", dtype_name(dt));
  register_twin({"matmul", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const int64_t m = 512, k = 768;
    const Tensor x = s.random(Shape{m, k}, dt, 3);
    const Tensor w = s.random(Shape{n, k}, dt, 4, -0.1, 0.1);  // (out, in)
    const Tensor bias = s.random(Shape{n}, dt, 5);
    const Tensor out = s.empty(Shape{m, n}, dt), pre = s.empty(Shape{m, n}, dt);
    ops::matmul(ctx, out, x, w, false, true, 1.0, 0.0, bias, ops::Epilogue::Gelu, pre);
    s.output("pre-activation", pre, product_tolerance(dt));
    s.output("gelu(x w^T + b)", out, gelu_tolerance(dt));
    // Bias alone, and GELU without saving the pre-activation.
    ops::matmul(ctx, out, x, w, false, true, 1.0, 0.0, bias);
    s.output("x w^T + b", out, product_tolerance(dt));
    ops::matmul(ctx, out, x, w, false, true, 1.0, 0.0, Tensor(), ops::Epilogue::Gelu);
    s.output("gelu(x w^T)", out, gelu_tolerance(dt));
  }});
}

// The GELU gradient fused into the matmul: out = (dy @ w) * gelu'(pre). n = 3072 runs
// cuBLASLt's DGELU; n = 100 (not a multiple of 8) our fallback.
void dgelu_case(int64_t n, DType dt) {
  const std::string name = str_cat("matmul dgelu 512x", n, "x768 ", dtype_name(dt));
  register_twin({"matmul", name, [=](TwinSide& s) {
    const int64_t m = 512, k = 768;
    const Tensor dy = s.random(Shape{m, k}, dt, 13);
    const Tensor w = s.random(Shape{k, n}, dt, 14, -0.1, 0.1);  // proj weight (C, F)
    const Tensor pre = s.random(Shape{m, n}, dt, 15, -3, 3);
    const Tensor out = s.empty(Shape{m, n}, dt);
    ops::matmul(s.ctx(), out, dy, w, false, false, 1.0, 0.0, Tensor(), ops::Epilogue::DGelu, pre);
    s.output("out", out, gelu_tolerance(dt));
  }});
}

// dW (out, in) += dy^T @ x and db (out) += the column sums of dy, as a linear layer's
// backward: cuBLASLt's BGRADB epilogue where it has one (768, 2304), else matmul then
// bias_backward (100).
void bias_grad_case(int64_t out_f, bool accumulate) {
  const std::string name = str_cat("matmul_bias_grad 4096x", out_f, "x768 bf16",
                                   accumulate ? " accumulate" : "");
  register_twin({"matmul", name, [=](TwinSide& s) {
    const int64_t tokens = 4096, in_f = 768;
    const Tensor dy = s.random(Shape{tokens, out_f}, DType::bf16, 41);
    const Tensor x = s.random(Shape{tokens, in_f}, DType::bf16, 42);
    const Tensor dw = s.random(Shape{out_f, in_f}, DType::f32, 43);
    const Tensor db = s.random(Shape{out_f}, DType::f32, 44);
    ops::matmul_bias_grad(s.ctx(), dw, dy, x, true, false, 1.0, 1.0, db, accumulate);
    const Tolerance f32_sums =
        Tolerance::scaled(1e-5, "f32 sums of 4096 bf16 products/values in another order");
    s.output("dweight", dw, f32_sums);
    s.output("dbias", db, f32_sums);
  }});
}

void register_matmul_twins() {
  // Odd sizes, then GPT-2 124M's projections at B*T = 4096 rows (qkv, attn proj, fc, proj).
  struct Problem {
    int64_t m, n, k;
  };
  for (Problem p : {Problem{37, 45, 29}, Problem{4096, 2304, 768}, Problem{4096, 768, 768},
                    Problem{4096, 3072, 768}, Problem{4096, 768, 3072}}) {
    for (DType dt : {DType::bf16, DType::f32}) {
      for (int t = 0; t < 4; ++t) matmul_case(p.m, p.n, p.k, dt, t & 1, t & 2);
    }
  }
  for (int64_t n : {int64_t(3072), int64_t(100)}) {
    for (DType dt : {DType::bf16, DType::f32}) {
      epilogue_case(n, dt);
      dgelu_case(n, dt);
    }
  }
  for (int64_t out_f : {int64_t(768), int64_t(2304), int64_t(100)}) {
    for (bool accumulate : {false, true}) bias_grad_case(out_f, accumulate);
  }

  // dW (C_out, C_in) += dout^T (C_out, N) @ x (N, C_in), twice, in f32; then alpha scales
  // the product and beta the old output.
  const std::string accumulation = "matmul bf16 products into f32 weight gradients 2304x768x4096";
  register_twin({"matmul", accumulation, [](TwinSide& s) {
    Context& ctx = s.ctx();
    const int64_t rows = 4096, c_out = 2304, c_in = 768;
    const Tensor dout = s.random(Shape{rows, c_out}, DType::bf16, 6);
    const Tensor x = s.random(Shape{rows, c_in}, DType::bf16, 7);
    const Tensor dw = s.random(Shape{c_out, c_in}, DType::f32, 8);
    for (int rep = 0; rep < 2; ++rep) ops::matmul(ctx, dw, dout, x, true, false, 1.0, 1.0);
    const Tolerance f32_out = Tolerance::scaled(2e-5, "f32 accumulation order over K = 4096");
    s.output("dweight beta 1", dw, f32_out);
    ops::matmul(ctx, dw, dout, x, true, false, 0.5, -2.0);
    s.output("dweight alpha 0.5 beta -2", dw, f32_out);
  }});

  // Batched: (Bt, M, K) @ (Bt, K, N) with alpha and beta (the reference attention's form).
  for (DType dt : {DType::bf16, DType::f32}) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const std::string name = str_cat("batched_matmul 48x64x80x72 ", dtype_name(dt),
                                       ta ? " ta" : "", tb ? " tb" : "");
      register_twin({"matmul", name, [=](TwinSide& s) {
        const int64_t bt = 48, m = 64, n = 80, k = 72;
        const Tensor a = s.random(ta ? Shape{bt, k, m} : Shape{bt, m, k}, dt, 9);
        const Tensor b = s.random(tb ? Shape{bt, n, k} : Shape{bt, k, n}, dt, 10);
        const Tensor out = s.random(Shape{bt, m, n}, dt, 11);
        ops::batched_matmul(s.ctx(), out, a, b, ta, tb, 0.7, 0.3);
        s.output("out", out, product_tolerance(dt));
      }});
    }
  }

  // Tuning (kernels/cuda/matmul.h: MatmulTuning) times cuBLASLt's candidates on the call's
  // own operands: the results must be those of an untuned call, for epilogues that write
  // aux or bias sums and for outputs that accumulate (beta != 0), where the timed runs
  // change the output before it is put back.
  register_twin({"matmul", "matmul tuning keeps every result (bias+gelu, dgelu, bgradb, beta)",
                 [](TwinSide& s) {
    Context& ctx = s.ctx();
    TimedMatmuls timed(s, false);  // every problem below is timed on its first call
    const int64_t m = 1024, c = 768, f = 3072;
    const Tensor x = s.random(Shape{m, c}, DType::bf16, 51);
    const Tensor w_fc = s.random(Shape{f, c}, DType::bf16, 52, -0.1, 0.1);    // (F, C)
    const Tensor b_fc = s.random(Shape{f}, DType::bf16, 53);
    const Tensor w_proj = s.random(Shape{c, f}, DType::bf16, 54, -0.1, 0.1);  // (C, F)
    const Tensor dy = s.random(Shape{m, c}, DType::bf16, 55);
    const Tensor pre = s.empty(Shape{m, f}, DType::bf16), act = s.empty(Shape{m, f}, DType::bf16);
    ops::matmul(ctx, act, x, w_fc, false, true, 1.0, 0.0, b_fc, ops::Epilogue::Gelu, pre);
    s.output("pre-activation", pre, product_tolerance(DType::bf16));
    s.output("gelu(x w^T + b)", act, gelu_tolerance(DType::bf16));
    const Tensor dh = s.empty(Shape{m, f}, DType::bf16);  // (dy @ W_proj) * gelu'(pre)
    ops::matmul(ctx, dh, dy, w_proj, false, false, 1.0, 0.0, Tensor(), ops::Epilogue::DGelu, pre);
    s.output("dgelu", dh, gelu_tolerance(DType::bf16));
    // The accumulating products take inputs of their own (not act: the two sides' act differ
    // by a bf16 rounding, which would dwarf the f32 accumulation these tolerances are for).
    const Tolerance f32_sums =
        Tolerance::scaled(1e-5, "f32 sums of 1024 bf16 products/values in another order");
    const Tensor a = s.random(Shape{m, f}, DType::bf16, 59);  // (M, F), as act
    const Tensor dw = s.random(Shape{c, f}, DType::f32, 56), db = s.random(Shape{c}, DType::f32, 57);
    for (int rep = 0; rep < 2; ++rep)  // dW_proj (C, F) += dy^T a; db += sums of dy
      ops::matmul_bias_grad(ctx, dw, dy, a, true, false, 1.0, 1.0, db, true);
    s.output("dweight accumulated", dw, f32_sums);
    s.output("dbias accumulated", db, f32_sums);
    const Tensor acc = s.random(Shape{m, c}, DType::f32, 58);  // acc = 0.5 a w_proj^T - 2 acc
    ops::matmul(ctx, acc, a, w_proj, false, true, 0.5, -2.0);
    s.output("alpha 0.5 beta -2", acc, Tolerance::scaled(2e-5, "f32 accumulation order"));
    timed.check(s, 4);
  }});

  // One cuBLASLt plan per problem shape, reused by every later call of that shape.
  register_twin({"matmul", "matmul plan cache 128x128x256 bf16", [](TwinSide& s) {
    Context& ctx = s.ctx();
    const Tensor a = s.random(Shape{128, 256}, DType::bf16, 12);
    const Tensor out = s.empty(Shape{128, 128}, DType::bf16);
    ops::matmul(ctx, out, a, a, false, true);
    s.output("a a^T", out, product_tolerance(DType::bf16));
#if FSDP_WITH_CUDA
    if (!s.is_reference()) {
      auto& blas = ctx.extension<kernels::cuda::Blas>();
      const size_t plans = blas.cached_plans();
      for (int i = 0; i < 5; ++i) ops::matmul(ctx, out, a, a, false, true);
      s.expect(blas.cached_plans() == plans, "one plan per shape, reused");
    }
#endif
  }});

  // Shapes that never stop coming (a mixture-of-experts layer's rows per expert change every
  // step): the cache stays bounded and keeps the shape in use.
  register_twin({"matmul", "matmul plan cache bounded under ever new shapes f32", [](TwinSide& s) {
    Context& ctx = s.ctx();
    const int64_t rows = 1124;  // more shapes than the cache holds
    const Tensor a = s.random(Shape{rows, 32}, DType::f32, 13);
    const Tensor w = s.random(Shape{16, 32}, DType::f32, 14);
    const Tensor out = s.empty(Shape{rows, 16}, DType::f32);
    for (int64_t m = 1; m <= rows; ++m)  // out[:m] = a[:m] w^T, one new shape per m
      ops::matmul(ctx, out.narrow(0, 0, m), a.narrow(0, 0, m), w, false, true);
    s.output("a w^T", out, product_tolerance(DType::f32));
#if FSDP_WITH_CUDA
    static_assert(kernels::cuda::Blas::kMaxCachedPlans < 1124, "the case must overflow the cache");
    if (!s.is_reference())
      s.expect(ctx.extension<kernels::cuda::Blas>().cached_plans() <= kernels::cuda::Blas::kMaxCachedPlans,
               "the plan cache stays within its bound");
#endif
  }});
}

}  // namespace
FSDP_REGISTER_TWINS(register_matmul_twins)
}  // namespace fsdp::testing
