// cuBLASLt matmuls against the CPU matmul: transposes, bias and GELU epilogues, bf16 inputs
// with f32 accumulation into f32 outputs, batched problems, and the plan cache.
#include "kernels/nn_ops.h"
#include "kernels/ops.h"
#include "tests/kernels/nn_cuda_test_util.h"
#include "tests/test_support.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/matmul.h"
#endif

using namespace fsdp;
using namespace fsdp::testing;

namespace {

// Errors relative to the output's scale. bf16 outputs: one rounding of 2^-9 relative per
// element, plus f32 accumulation-order differences (~1e-6): 5e-3 holds with margin. f32:
// both sides accumulate in f32 in different orders, sqrt(K) * 2^-24 relative: 2e-5.
double tolerance(DType out) { return out == DType::bf16 ? 5e-3 : 2e-5; }

Shape operand(int64_t rows, int64_t cols, bool trans) {
  return trans ? Shape{cols, rows} : Shape{rows, cols};
}

struct MatmulCase {
  int64_t m, n, k;
};

}  // namespace

TEST_CASE("CUDA matmul matches the CPU for every transpose, dtype and GPT-2 shape",
          "[kernels][nn][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  // Odd sizes, then GPT-2 124M's projections at B*T = 4096 rows (qkv, attn proj, fc, proj).
  for (MatmulCase c : {MatmulCase{37, 45, 29}, MatmulCase{4096, 2304, 768},
                       MatmulCase{4096, 768, 768}, MatmulCase{4096, 3072, 768},
                       MatmulCase{4096, 768, 3072}}) {
    for (DType dt : {DType::bf16, DType::f32}) {
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        INFO(c.m << "x" << c.n << "x" << c.k << " " << dtype_name(dt) << " ta " << ta << " tb " << tb);
        Dual a = dual_random(cpu, gpu, operand(c.m, c.k, ta), dt, 1);
        Dual b = dual_random(cpu, gpu, operand(c.k, c.n, tb), dt, 2);
        Dual out = dual_empty(cpu, gpu, Shape{c.m, c.n}, dt);
        ops::matmul(cpu, out.cpu, a.cpu, b.cpu, ta, tb);
        ops::matmul(gpu, out.gpu, a.gpu, b.gpu, ta, tb);
        CHECK(scaled_error(gpu, out) < tolerance(dt));
      }
    }
  }
}

TEST_CASE("CUDA matmul bias and GELU epilogues (with the pre-activation saved)",
          "[kernels][nn][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  // n = 3072 uses cuBLASLt's GELU_AUX_BIAS; n = 100 (not a multiple of 8) our fallback.
  for (int64_t n : {int64_t(3072), int64_t(100)}) {
    for (DType dt : {DType::bf16, DType::f32}) {
      INFO("n " << n << " " << dtype_name(dt));
      const int64_t m = 512, k = 768;
      Dual x = dual_random(cpu, gpu, Shape{m, k}, dt, 3);
      Dual w = dual_random(cpu, gpu, Shape{n, k}, dt, 4, -0.1, 0.1);  // Linear weight (out, in)
      Dual bias = dual_random(cpu, gpu, Shape{n}, dt, 5);
      Dual out = dual_empty(cpu, gpu, Shape{m, n}, dt), pre = dual_empty(cpu, gpu, Shape{m, n}, dt);
      ops::matmul(cpu, out.cpu, x.cpu, w.cpu, false, true, 1.0, 0.0, bias.cpu,
                  ops::Epilogue::Gelu, pre.cpu);
      ops::matmul(gpu, out.gpu, x.gpu, w.gpu, false, true, 1.0, 0.0, bias.gpu,
                  ops::Epilogue::Gelu, pre.gpu);
      CHECK(scaled_error(gpu, pre) < tolerance(dt));
      // cuBLASLt's GELU is the tanh form like ours; f32 tanh approximations differ by ~1e-6.
      CHECK(scaled_error(gpu, out) < std::max(tolerance(dt), 1e-5));
      // Bias alone, and GELU without saving the pre-activation.
      ops::matmul(cpu, out.cpu, x.cpu, w.cpu, false, true, 1.0, 0.0, bias.cpu);
      ops::matmul(gpu, out.gpu, x.gpu, w.gpu, false, true, 1.0, 0.0, bias.gpu);
      CHECK(scaled_error(gpu, out) < tolerance(dt));
      ops::matmul(cpu, out.cpu, x.cpu, w.cpu, false, true, 1.0, 0.0, Tensor(), ops::Epilogue::Gelu);
      ops::matmul(gpu, out.gpu, x.gpu, w.gpu, false, true, 1.0, 0.0, Tensor(), ops::Epilogue::Gelu);
      CHECK(scaled_error(gpu, out) < std::max(tolerance(dt), 1e-5));
    }
  }
}

TEST_CASE("CUDA matmul DGelu epilogue (the GELU gradient fused into the matmul)",
          "[kernels][nn][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  // n = 3072 uses cuBLASLt's DGELU; n = 100 (not a multiple of 8) our fallback.
  for (int64_t n : {int64_t(3072), int64_t(100)}) {
    for (DType dt : {DType::bf16, DType::f32}) {
      INFO("n " << n << " " << dtype_name(dt));
      const int64_t m = 512, k = 768;
      Dual dy = dual_random(cpu, gpu, Shape{m, k}, dt, 13);
      Dual w = dual_random(cpu, gpu, Shape{k, n}, dt, 14, -0.1, 0.1);  // proj weight (C, F)
      Dual pre = dual_random(cpu, gpu, Shape{m, n}, dt, 15, -3, 3);
      Dual out = dual_empty(cpu, gpu, Shape{m, n}, dt);
      ops::matmul(cpu, out.cpu, dy.cpu, w.cpu, false, false, 1.0, 0.0, Tensor(),
                  ops::Epilogue::DGelu, pre.cpu);
      ops::matmul(gpu, out.gpu, dy.gpu, w.gpu, false, false, 1.0, 0.0, Tensor(),
                  ops::Epilogue::DGelu, pre.gpu);
      // As the forward epilogue: f32 tanh approximations differ by ~1e-6.
      CHECK(scaled_error(gpu, out) < std::max(tolerance(dt), 1e-5));
    }
  }
}

TEST_CASE("CUDA weight and bias gradients in one matmul (BGRADB) match the CPU",
          "[kernels][nn][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  // dW (out, in) += dy^T @ x and db (out) += column sums of dy, as a linear layer's backward.
  for (int64_t out_f : {int64_t(768), int64_t(2304), int64_t(100)}) {
    for (bool accumulate : {false, true}) {
      INFO("out " << out_f << " accumulate " << accumulate);
      const int64_t tokens = 4096, in_f = 768;
      Dual dy = dual_random(cpu, gpu, Shape{tokens, out_f}, DType::bf16, 41);
      Dual x = dual_random(cpu, gpu, Shape{tokens, in_f}, DType::bf16, 42);
      Dual dw = dual_random(cpu, gpu, Shape{out_f, in_f}, DType::f32, 43);
      Dual db = dual_random(cpu, gpu, Shape{out_f}, DType::f32, 44);
      ops::matmul_bias_grad(cpu, dw.cpu, dy.cpu, x.cpu, true, false, 1.0, 1.0, db.cpu, accumulate);
      ops::matmul_bias_grad(gpu, dw.gpu, dy.gpu, x.gpu, true, false, 1.0, 1.0, db.gpu, accumulate);
      // f32 sums of 4096 bf16 products / values in another order: 1e-5 of the scale.
      CHECK(scaled_error(gpu, dw) < 1e-5);
      CHECK(scaled_error(gpu, db) < 1e-5);
    }
  }
}

TEST_CASE("CUDA matmul accumulates bf16 products into f32 weight gradients (beta = 1)",
          "[kernels][nn][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  // dW (C_out, C_in) += dout^T (C_out, N) @ x (N, C_in), twice, in f32.
  const int64_t rows = 4096, c_out = 2304, c_in = 768;
  Dual dout = dual_random(cpu, gpu, Shape{rows, c_out}, DType::bf16, 6);
  Dual x = dual_random(cpu, gpu, Shape{rows, c_in}, DType::bf16, 7);
  Dual dw = dual_random(cpu, gpu, Shape{c_out, c_in}, DType::f32, 8);
  for (int rep = 0; rep < 2; ++rep) {
    ops::matmul(cpu, dw.cpu, dout.cpu, x.cpu, true, false, 1.0, 1.0);
    ops::matmul(gpu, dw.gpu, dout.gpu, x.gpu, true, false, 1.0, 1.0);
  }
  // f32 output: accumulation-order differences only, over K = 4096 terms.
  CHECK(scaled_error(gpu, dw) < 2e-5);
  // alpha scales the product, beta the old output.
  ops::matmul(cpu, dw.cpu, dout.cpu, x.cpu, true, false, 0.5, -2.0);
  ops::matmul(gpu, dw.gpu, dout.gpu, x.gpu, true, false, 0.5, -2.0);
  CHECK(scaled_error(gpu, dw) < 2e-5);
}

TEST_CASE("CUDA batched matmul and the plan cache", "[kernels][nn][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  for (DType dt : {DType::bf16, DType::f32}) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const int64_t bt = 48, m = 64, n = 80, k = 72;
      Dual a = dual_random(cpu, gpu, ta ? Shape{bt, k, m} : Shape{bt, m, k}, dt, 9);
      Dual b = dual_random(cpu, gpu, tb ? Shape{bt, n, k} : Shape{bt, k, n}, dt, 10);
      Dual out = dual_random(cpu, gpu, Shape{bt, m, n}, dt, 11);
      ops::batched_matmul(cpu, out.cpu, a.cpu, b.cpu, ta, tb, 0.7, 0.3);
      ops::batched_matmul(gpu, out.gpu, a.gpu, b.gpu, ta, tb, 0.7, 0.3);
      CHECK(scaled_error(gpu, out) < tolerance(dt));
    }
  }
#if FSDP_WITH_CUDA
  auto& blas = gpu.extension<kernels::cuda::Blas>();
  Dual a = dual_random(cpu, gpu, Shape{128, 256}, DType::bf16, 12);
  Dual out = dual_empty(cpu, gpu, Shape{128, 128}, DType::bf16);
  ops::matmul(gpu, out.gpu, a.gpu, a.gpu, false, true);
  const size_t plans = blas.cached_plans();
  for (int i = 0; i < 5; ++i) ops::matmul(gpu, out.gpu, a.gpu, a.gpu, false, true);
  CHECK(blas.cached_plans() == plans);  // one plan per shape, reused
#endif
}

TEST_CASE("CUDA bias_backward: deterministic column sums into f32 or bf16", "[kernels][nn][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  for (DType dt : {DType::bf16, DType::f32}) {
    for (int64_t n : {int64_t(2304), int64_t(37)}) {  // packed and scalar column paths
      Dual dout = dual_random(cpu, gpu, Shape{4096, n}, dt, 13);
      Dual db = dual_full(cpu, gpu, Shape{n}, DType::f32, 1.0);
      ops::bias_backward(cpu, db.cpu, dout.cpu, true);
      ops::bias_backward(gpu, db.gpu, dout.gpu, true);
      // Sums of 4096 terms of |x| <= 1 (scale ~64) in f32, different order: 1e-5.
      CHECK(scaled_error(gpu, db) < 1e-5);
      Tensor again = ops::full(gpu, Shape{n}, DType::f32, 1.0);
      ops::bias_backward(gpu, again, dout.gpu, true);
      CHECK(same_bits(gpu, again, db.gpu));
      Dual dbb = dual_empty(cpu, gpu, Shape{n}, DType::bf16);
      ops::bias_backward(cpu, dbb.cpu, dout.cpu, false);
      ops::bias_backward(gpu, dbb.gpu, dout.gpu, false);
      CHECK(scaled_error(gpu, dbb) < 5e-3);  // one bf16 rounding of the sum
    }
  }
}
