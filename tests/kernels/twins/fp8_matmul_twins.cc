// cuBLASLt's FP8 matmul (Blas::fp8_matmul, kernels/cuda/matmul.h) against the CPU's f32
// simulation on the same FP8 bytes, as an FP8 linear layer calls it: the forward (e4m3 x
// e4m3, bf16 out, with bias and GELU), the input gradient (e5m2 gradient x e4m3 weight, bf16
// out accumulated with beta 1) and the weight gradient (e5m2 x e4m3 into an f32 gradient,
// beta 1), at GPT-2 124M's shapes (d 768, d_ff 3072) and 1.3B's (d 2048, d_ff 8192) with
// 4096 tokens. The GPU side needs FP8 tensor cores: compute capability 8.9+.
#include "kernels/fp8_math.h"
#include "kernels/nn_ops.h"
#include "kernels/ops.h"
#include "tests/kernels/twin_harness.h"

namespace fsdp::testing {
namespace {

// Relative to the output's scale. Both sides multiply the same FP8 bytes exactly; they
// differ in the accumulation: f32 in one order on the CPU, and on Hopper's tensor cores
// partial sums of FP8 products kept with fewer bits (about 14, as DeepSeek-V3's report
// measured) before cuBLASLt promotes them to f32 (its default, fast accumulation off): up
// to ~1e-4 of the scale per promoted block over K / 128 blocks, 2e-3 allows for it. A bf16
// output adds one rounding (2^-9 relative): 6e-3.
Tolerance fp8_tolerance(DType out) {
  return out == DType::bf16
             ? Tolerance::scaled(6e-3, "bf16 output rounding + FP8 tensor-core accumulation")
             : Tolerance::scaled(2e-3, "FP8 tensor-core partial sums before f32 promotion");
}

// x (R, C) random in [-1, 1) (bf16 values), quantized to `fp8` on the side.
struct Operand {
  Tensor q, scales;
};
Operand operand(TwinSide& s, int64_t r, int64_t c, DType fp8, uint32_t seed, double range) {
  Context& ctx = s.ctx();
  const Tensor x = s.random(Shape{r, c}, DType::bf16, seed, -range, range);
  Operand o{ctx.empty(Shape{r, c}, fp8), ctx.empty(Shape{kernels::kFp8Scales}, DType::f32)};
  ops::fp8_scales(ctx, o.scales, x, fp8);
  ops::fp8_quantize(ctx, o.q, Tensor(), x, o.scales);
  return o;
}

// out (M, N) (+)= a (M, K) @ b (N, K)^T, a and b FP8.
void product_case(const std::string& what, int64_t m, int64_t n, int64_t k, DType a_dt,
                  DType b_dt, DType out_dt, double beta) {
  const std::string name = str_cat("fp8_matmul ", what, " ", m, "x", n, "x", k, " ",
                                   dtype_name(a_dt), " x ", dtype_name(b_dt), " -> ",
                                   dtype_name(out_dt), beta != 0 ? " beta 1" : "");
  register_twin({"matmul", name, [=](TwinSide& s) {
    const Operand a = operand(s, m, k, a_dt, 1, a_dt == DType::f8e5m2 ? 1e-3 : 2.0);
    const Operand b = operand(s, n, k, b_dt, 2, 0.1);
    s.output("a's bytes", a.q.reinterpret(DType::u8), Tolerance::exact("quantized alike"));
    const Tensor out = beta != 0 ? s.random(Shape{m, n}, out_dt, 3, -1e-2, 1e-2)
                                 : s.empty(Shape{m, n}, out_dt);
    ops::fp8_matmul(s.ctx(), out, a.q, a.scales, b.q, b.scales, beta);
    s.output("out", out, fp8_tolerance(out_dt));
  }});
}

// The forward of an MLP's first layer: gelu(x W^T + b), the pre-activation kept.
void epilogue_case(int64_t m, int64_t n, int64_t k) {
  const std::string name = str_cat("fp8_matmul bias+gelu ", m, "x", n, "x", k, " f8e4m3 -> bf16");
  register_twin({"matmul", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const Operand x = operand(s, m, k, DType::f8e4m3, 4, 2.0);
    const Operand w = operand(s, n, k, DType::f8e4m3, 5, 0.1);
    const Tensor bias = s.random(Shape{n}, DType::bf16, 6, -0.5, 0.5);
    const Tensor out = s.empty(Shape{m, n}, DType::bf16), pre = s.empty(Shape{m, n}, DType::bf16);
    ops::fp8_matmul(ctx, out, x.q, x.scales, w.q, w.scales, 0.0, bias, ops::Epilogue::Gelu, pre);
    s.output("pre-activation", pre, fp8_tolerance(DType::bf16));
    s.output("gelu", out, fp8_tolerance(DType::bf16));
    ops::fp8_matmul(ctx, out, x.q, x.scales, w.q, w.scales, 0.0, bias);
    s.output("x w^T + b", out, fp8_tolerance(DType::bf16));
  }});
}

void register_fp8_matmul_twins() {
  const DType e4 = DType::f8e4m3, e5 = DType::f8e5m2, bf = DType::bf16, f32 = DType::f32;
  const int64_t tokens = 4096;
  // GPT-2 124M: qkv, attention proj, fc, MLP proj forward; fc's dgrad and wgrad (hybrid),
  // and a wgrad of the e4m3 recipe.
  product_case("forward qkv", tokens, 2304, 768, e4, e4, bf, 0);
  product_case("forward proj", tokens, 768, 768, e4, e4, bf, 0);
  product_case("forward mlp proj", tokens, 768, 3072, e4, e4, bf, 0);
  epilogue_case(tokens, 3072, 768);
  product_case("dgrad fc", tokens, 768, 3072, e5, e4, bf, 1);
  product_case("dgrad fc", tokens, 768, 3072, e5, e4, bf, 0);
  product_case("wgrad fc", 3072, 768, tokens, e5, e4, f32, 1);
  product_case("wgrad proj", 768, 3072, tokens, e4, e4, f32, 1);
  // 1.3B: the MLP's forward, dgrad and wgrad.
  product_case("forward fc", tokens, 8192, 2048, e4, e4, bf, 0);
  product_case("dgrad fc", tokens, 2048, 8192, e5, e4, bf, 0);
  product_case("wgrad fc", 8192, 2048, tokens, e5, e4, f32, 1);
  // Small, and the cuBLASLt operand order (our b is its A): e4m3 a with an e5m2 b.
  product_case("small", 64, 48, 32, e4, e5, bf, 0);
}

}  // namespace
FSDP_REGISTER_TWINS(register_fp8_matmul_twins)
}  // namespace fsdp::testing
