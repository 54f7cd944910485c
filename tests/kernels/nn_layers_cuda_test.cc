// CUDA norms, activations, rotary and token embeddings, cross-entropy, AdamW and the
// initializers against their CPU twins, in bf16 and f32, at GPT-2 124M and Llama shapes.
#include <cmath>
#include <tuple>

#include "kernels/nn_ops.h"
#include "kernels/ops.h"
#include "tests/kernels/nn_cuda_test_util.h"
#include "tests/test_support.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

// Relative to the output's scale: a bf16 output carries one rounding (2^-9) on top of f32
// arithmetic, so 5e-3; f32 outputs differ by f32 rounding and summation order, 1e-5 (2e-5
// where thousands of terms are summed).
double tol(DType dt) { return dt == DType::bf16 ? 5e-3 : 1e-5; }

}  // namespace

TEST_CASE("CUDA layernorm forward/backward match the CPU; weight grads deterministic",
          "[kernels][nn][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  // GPT-2: 4096 rows of 768 (packed loads); 300 rows of 100 channels (scalar path).
  for (auto [rows, C] : {std::pair<int64_t, int64_t>{4096, 768}, {300, 100}}) {
    for (DType dt : {DType::bf16, DType::f32}) {
      INFO(rows << "x" << C << " " << dtype_name(dt));
      Dual x = dual_random(cpu, gpu, Shape{rows, C}, dt, 1, -3, 5);
      Dual w = dual_random(cpu, gpu, Shape{C}, dt, 2, 0.5, 1.5);
      Dual b = dual_random(cpu, gpu, Shape{C}, dt, 3);
      Dual out = dual_empty(cpu, gpu, Shape{rows, C}, dt);
      Dual mean = dual_empty(cpu, gpu, Shape{rows}, DType::f32);
      Dual rstd = dual_empty(cpu, gpu, Shape{rows}, DType::f32);
      ops::layernorm_forward(cpu, out.cpu, mean.cpu, rstd.cpu, x.cpu, w.cpu, b.cpu, 1e-5);
      ops::layernorm_forward(gpu, out.gpu, mean.gpu, rstd.gpu, x.gpu, w.gpu, b.gpu, 1e-5);
      CHECK(scaled_error(gpu, out) < tol(dt));
      CHECK(scaled_error(gpu, mean) < 1e-5);  // f32 statistics on both sides
      CHECK(scaled_error(gpu, rstd) < 1e-5);

      Dual dout = dual_random(cpu, gpu, Shape{rows, C}, dt, 4);
      Dual dx = dual_random(cpu, gpu, Shape{rows, C}, dt, 5);  // the residual stream's grad
      Dual dw = dual_full(cpu, gpu, Shape{C}, DType::f32, 0.5);
      Dual db = dual_full(cpu, gpu, Shape{C}, DType::f32, -0.5);
      // The GPU reads the statistics it saved; the CPU its own.
      ops::layernorm_backward(cpu, dx.cpu, dw.cpu, db.cpu, dout.cpu, x.cpu, w.cpu, mean.cpu,
                              rstd.cpu, true, true);
      ops::layernorm_backward(gpu, dx.gpu, dw.gpu, db.gpu, dout.gpu, x.gpu, w.gpu, mean.gpu,
                              rstd.gpu, true, true);
      CHECK(scaled_error(gpu, dx) < tol(dt));
      CHECK(scaled_error(gpu, dw) < 2e-5);  // f32 sums over `rows` rows
      CHECK(scaled_error(gpu, db) < 2e-5);
      // Same inputs, same bits.
      Tensor dw2 = ops::full(gpu, Shape{C}, DType::f32, 0.5);
      Tensor db2 = ops::full(gpu, Shape{C}, DType::f32, -0.5);
      ops::layernorm_backward(gpu, Tensor(), dw2, db2, dout.gpu, x.gpu, w.gpu, mean.gpu, rstd.gpu,
                              false, true);
      CHECK(same_bits(gpu, dw2, dw.gpu));
      CHECK(same_bits(gpu, db2, db.gpu));
    }
  }
}

TEST_CASE("CUDA fused residual add + norm: the CPU's values, the unfused kernels' bits",
          "[kernels][nn][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  // GPT-2 and GPT 1.3B widths (packed loads); 100 channels (scalar path). Streams of the
  // compute dtype, and an f32 stream beside bf16 weights.
  struct Case {
    int64_t rows, C;
    DType dt, stream;
  };
  for (const Case& k : {Case{4096, 768, DType::bf16, DType::bf16}, Case{512, 2048, DType::bf16, DType::f32},
                        Case{300, 100, DType::f32, DType::f32}, Case{300, 100, DType::bf16, DType::bf16}}) {
    INFO(k.rows << "x" << k.C << " " << dtype_name(k.dt) << " stream " << dtype_name(k.stream));
    const Shape s{k.rows, k.C};
    Dual x = dual_random(cpu, gpu, s, k.dt, 21, -3, 5);
    Dual r = dual_random(cpu, gpu, s, k.dt, 22, -1, 1);
    Dual w = dual_random(cpu, gpu, Shape{k.C}, k.dt, 23, 0.5, 1.5);
    Dual b = dual_random(cpu, gpu, Shape{k.C}, k.dt, 24);
    const Tensor xs = ops::cast(gpu, x.gpu, k.stream);  // the stream on the GPU
    Dual sum{ops::empty(cpu, s, x.cpu.dtype()), ops::empty(gpu, s, k.stream)};
    Dual out = dual_empty(cpu, gpu, s, k.dt), rout = dual_empty(cpu, gpu, s, k.dt);
    Dual mean = dual_empty(cpu, gpu, Shape{k.rows}, DType::f32);
    Dual rstd = dual_empty(cpu, gpu, Shape{k.rows}, DType::f32);
    Dual rrstd = dual_empty(cpu, gpu, Shape{k.rows}, DType::f32);
    ops::add_layernorm_forward(cpu, sum.cpu, out.cpu, mean.cpu, rstd.cpu, x.cpu, r.cpu, w.cpu,
                               b.cpu, 1e-5);
    ops::add_layernorm_forward(gpu, sum.gpu, out.gpu, mean.gpu, rstd.gpu, xs, r.gpu, w.gpu,
                               b.gpu, 1e-5);
    if (k.stream == k.dt) CHECK(scaled_error(gpu, sum) < tol(k.dt));
    CHECK(scaled_error(gpu, out) < tol(k.dt));
    // A bf16 stream rounds the sum before it is normalized (as the add kernel stores it);
    // the CPU's f32 sum is not rounded, so its statistics are compared on the GPU's sum.
    const Tensor h_cpu = ops::to_device(gpu, ops::cast(gpu, sum.gpu, DType::f32), Device::cpu());
    ops::layernorm_forward(cpu, out.cpu, mean.cpu, rstd.cpu, h_cpu, w.cpu, b.cpu, 1e-5);
    CHECK(scaled_error(gpu, mean) < 1e-5);
    CHECK(scaled_error(gpu, rstd) < 1e-5);
    // The add kernel then the norm kernel give the same bits as the fused kernel.
    Tensor h = ops::empty(gpu, s, k.stream), o2 = ops::empty(gpu, s, k.dt);
    Tensor m2 = ops::empty(gpu, Shape{k.rows}, DType::f32);
    Tensor r2 = ops::empty(gpu, Shape{k.rows}, DType::f32);
    ops::add(gpu, h, xs, r.gpu);
    ops::layernorm_forward(gpu, o2, m2, r2, h, w.gpu, b.gpu, 1e-5);
    CHECK(same_bits(gpu, h, sum.gpu));
    CHECK(same_bits(gpu, o2, out.gpu));
    CHECK(same_bits(gpu, m2, mean.gpu));
    CHECK(same_bits(gpu, r2, rstd.gpu));
    Tensor rsum = ops::empty(gpu, s, k.stream);
    ops::add_rmsnorm_forward(cpu, sum.cpu, rout.cpu, rrstd.cpu, x.cpu, r.cpu, w.cpu, 1e-6);
    ops::add_rmsnorm_forward(gpu, rsum, rout.gpu, rrstd.gpu, xs, r.gpu, w.gpu, 1e-6);
    CHECK(scaled_error(gpu, rout) < tol(k.dt));
    ops::rmsnorm_forward(cpu, rout.cpu, rrstd.cpu, h_cpu, w.cpu, 1e-6);  // statistics: as above
    CHECK(scaled_error(gpu, rrstd) < 1e-5);
    ops::rmsnorm_forward(gpu, o2, r2, h, w.gpu, 1e-6);
    CHECK(same_bits(gpu, rsum, h));
    CHECK(same_bits(gpu, o2, rout.gpu));
    CHECK(same_bits(gpu, r2, rrstd.gpu));

    // Backward with an addend equals accumulating into a copy of it, bit for bit, and
    // leaves the addend unchanged.
    const Tensor dout = ops::cast(gpu, dual_random(cpu, gpu, s, k.dt, 25).gpu, k.dt);
    const Tensor addend = ops::cast(gpu, dual_random(cpu, gpu, s, k.dt, 26).gpu, k.stream);
    const Tensor before = ops::clone(gpu, addend);
    Tensor acc = ops::clone(gpu, addend), dx = ops::empty(gpu, s, k.stream);
    Tensor dw = ops::zeros(gpu, Shape{k.C}, DType::f32), db = ops::zeros(gpu, Shape{k.C}, DType::f32);
    ops::layernorm_backward(gpu, acc, dw, db, dout, h, w.gpu, mean.gpu, rstd.gpu, true, true);
    ops::layernorm_backward(gpu, dx, dw, db, dout, h, w.gpu, mean.gpu, rstd.gpu, false, true,
                            addend);
    CHECK(same_bits(gpu, dx, acc));
    CHECK(same_bits(gpu, addend, before));
    Tensor racc = ops::clone(gpu, addend), rdx = ops::empty(gpu, s, k.stream);
    ops::rmsnorm_backward(gpu, racc, dw, dout, h, w.gpu, rrstd.gpu, true, true);
    ops::rmsnorm_backward(gpu, rdx, dw, dout, h, w.gpu, rrstd.gpu, false, true, addend);
    CHECK(same_bits(gpu, rdx, racc));
  }
}

TEST_CASE("CUDA rmsnorm forward/backward at Llama widths", "[kernels][nn][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  // 4096 channels fit one warp's sums in 48 KiB; 8192 needs the larger shared-memory opt-in.
  for (auto [rows, C] : {std::pair<int64_t, int64_t>{1024, 4096}, {64, 8192}, {33, 72}}) {
    for (DType dt : {DType::bf16, DType::f32}) {
      INFO(rows << "x" << C << " " << dtype_name(dt));
      Dual x = dual_random(cpu, gpu, Shape{rows, C}, dt, 6, -2, 2);
      Dual w = dual_random(cpu, gpu, Shape{C}, dt, 7, 0.5, 1.5);
      Dual out = dual_empty(cpu, gpu, Shape{rows, C}, dt);
      Dual rstd = dual_empty(cpu, gpu, Shape{rows}, DType::f32);
      ops::rmsnorm_forward(cpu, out.cpu, rstd.cpu, x.cpu, w.cpu, 1e-6);
      ops::rmsnorm_forward(gpu, out.gpu, rstd.gpu, x.gpu, w.gpu, 1e-6);
      CHECK(scaled_error(gpu, out) < tol(dt));
      CHECK(scaled_error(gpu, rstd) < 1e-5);
      Dual dout = dual_random(cpu, gpu, Shape{rows, C}, dt, 8);
      Dual dx = dual_empty(cpu, gpu, Shape{rows, C}, dt);
      Dual dw = dual_empty(cpu, gpu, Shape{C}, dt);  // bf16 parameter grads too
      ops::rmsnorm_backward(cpu, dx.cpu, dw.cpu, dout.cpu, x.cpu, w.cpu, rstd.cpu, false, false);
      ops::rmsnorm_backward(gpu, dx.gpu, dw.gpu, dout.gpu, x.gpu, w.gpu, rstd.gpu, false, false);
      CHECK(scaled_error(gpu, dx) < tol(dt));
      CHECK(scaled_error(gpu, dw) < std::max(tol(dt), 2e-5));
    }
  }
}

TEST_CASE("CUDA norms and embeddings with an f32 residual stream beside bf16 weights",
          "[kernels][nn][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  const DType bf = DType::bf16, f32 = DType::f32;
  // GPT-2 width (8-wide packs: two 128-bit f32 loads per bf16 pack) and an odd width.
  for (auto [rows, C] : {std::pair<int64_t, int64_t>{4096, 768}, {300, 100}}) {
    INFO(rows << "x" << C);
    Dual x = dual_random(cpu, gpu, Shape{rows, C}, f32, 21, -3, 5);  // the f32 stream
    Dual w = dual_random(cpu, gpu, Shape{C}, bf, 22, 0.5, 1.5);
    Dual b = dual_random(cpu, gpu, Shape{C}, bf, 23);
    Dual out = dual_empty(cpu, gpu, Shape{rows, C}, bf);
    Dual mean = dual_empty(cpu, gpu, Shape{rows}, f32);
    Dual rstd = dual_empty(cpu, gpu, Shape{rows}, f32);
    ops::layernorm_forward(cpu, out.cpu, mean.cpu, rstd.cpu, x.cpu, w.cpu, b.cpu, 1e-5);
    ops::layernorm_forward(gpu, out.gpu, mean.gpu, rstd.gpu, x.gpu, w.gpu, b.gpu, 1e-5);
    CHECK(scaled_error(gpu, out) < tol(bf));  // one rounding of the bf16 output
    CHECK(scaled_error(gpu, mean) < 1e-5);    // statistics of the unrounded f32 stream
    CHECK(scaled_error(gpu, rstd) < 1e-5);
    Dual dout = dual_random(cpu, gpu, Shape{rows, C}, bf, 24);
    Dual dx = dual_random(cpu, gpu, Shape{rows, C}, f32, 25);  // accumulated in f32
    Dual dw = dual_full(cpu, gpu, Shape{C}, f32, 0.5);
    Dual db = dual_full(cpu, gpu, Shape{C}, f32, -0.5);
    ops::layernorm_backward(cpu, dx.cpu, dw.cpu, db.cpu, dout.cpu, x.cpu, w.cpu, mean.cpu,
                            rstd.cpu, true, true);
    ops::layernorm_backward(gpu, dx.gpu, dw.gpu, db.gpu, dout.gpu, x.gpu, w.gpu, mean.gpu,
                            rstd.gpu, true, true);
    CHECK(scaled_error(gpu, dx) < 1e-5);  // f32 on both sides: no bf16 rounding of dx
    CHECK(scaled_error(gpu, dw) < 2e-5);
    CHECK(scaled_error(gpu, db) < 2e-5);

    Dual rout = dual_empty(cpu, gpu, Shape{rows, C}, bf);
    ops::rmsnorm_forward(cpu, rout.cpu, rstd.cpu, x.cpu, w.cpu, 1e-6);
    ops::rmsnorm_forward(gpu, rout.gpu, rstd.gpu, x.gpu, w.gpu, 1e-6);
    CHECK(scaled_error(gpu, rout) < tol(bf));
    Dual rdx = dual_empty(cpu, gpu, Shape{rows, C}, f32);
    Dual rdw = dual_full(cpu, gpu, Shape{C}, f32, 0.0);
    ops::rmsnorm_backward(cpu, rdx.cpu, rdw.cpu, dout.cpu, x.cpu, w.cpu, rstd.cpu, false, true);
    ops::rmsnorm_backward(gpu, rdx.gpu, rdw.gpu, dout.gpu, x.gpu, w.gpu, rstd.gpu, false, true);
    CHECK(scaled_error(gpu, rdx) < 1e-5);
    CHECK(scaled_error(gpu, rdw) < 2e-5);

    // The branch added to the stream: f32 + bf16 -> f32, no rounding beyond f32's.
    Dual branch = dual_random(cpu, gpu, Shape{rows, C}, bf, 26);
    Dual sum = dual_empty(cpu, gpu, Shape{rows, C}, f32);
    ops::add(cpu, sum.cpu, x.cpu, branch.cpu);
    ops::add(gpu, sum.gpu, x.gpu, branch.gpu);
    CHECK(scaled_error(gpu, sum) == 0);
  }
  // Token + position embeddings of bf16 tables into an f32 stream: the sum of two bf16
  // values is exact in f32, so the GPU matches the CPU bit for bit.
  const int64_t B = 2, T = 64, C = 768, V = 1000;
  std::vector<int32_t> ids(size_t(B * T));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 7919) % V);
  Tensor idx_cpu = ops::from_host<int32_t>(cpu, ids, Shape{B, T});
  Tensor idx_gpu = ops::to_device(gpu, idx_cpu, gpu.device());
  Dual wte = dual_random(cpu, gpu, Shape{V, C}, bf, 27);
  Dual wpe = dual_random(cpu, gpu, Shape{T, C}, bf, 28);
  Dual emb = dual_empty(cpu, gpu, Shape{B, T, C}, f32);
  ops::embedding_forward(cpu, emb.cpu, idx_cpu, wte.cpu, wpe.cpu);
  ops::embedding_forward(gpu, emb.gpu, idx_gpu, wte.gpu, wpe.gpu);
  CHECK(scaled_error(gpu, emb) == 0);
  // A narrower output than the tables (bf16 beside f32) is refused.
  CHECK_THROWS_AS(ops::embedding_forward(gpu, ops::empty(gpu, Shape{B, T, C}, bf), idx_gpu,
                                         ops::cast(gpu, wte.gpu, f32), Tensor()),
                  DTypeError);
}

TEST_CASE("CUDA gelu and swiglu match the CPU", "[kernels][nn][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  for (DType dt : {DType::bf16, DType::f32}) {
    for (int64_t n : {int64_t(4096 * 3072), int64_t(1001)}) {
      INFO(n << " " << dtype_name(dt));
      Dual x = dual_random(cpu, gpu, Shape{n}, dt, 1, -6, 6);
      Dual y = dual_empty(cpu, gpu, Shape{n}, dt);
      ops::gelu_forward(cpu, y.cpu, x.cpu);
      ops::gelu_forward(gpu, y.gpu, x.gpu);
      CHECK(scaled_error(gpu, y) < tol(dt));
      Dual g = dual_random(cpu, gpu, Shape{n}, dt, 2);
      Dual dx = dual_empty(cpu, gpu, Shape{n}, dt);
      ops::gelu_backward(cpu, dx.cpu, g.cpu, x.cpu);
      ops::gelu_backward(gpu, dx.gpu, g.gpu, x.gpu);
      CHECK(scaled_error(gpu, dx) < tol(dt));
    }
    // Llama MLP: (rows, 2F) -> (rows, F), F = 11008; and an odd F.
    for (int64_t F : {int64_t(11008), int64_t(13)}) {
      const int64_t rows = 256;
      Dual x = dual_random(cpu, gpu, Shape{rows, 2 * F}, dt, 3, -4, 4);
      Dual y = dual_empty(cpu, gpu, Shape{rows, F}, dt);
      ops::swiglu_forward(cpu, y.cpu, x.cpu);
      ops::swiglu_forward(gpu, y.gpu, x.gpu);
      CHECK(scaled_error(gpu, y) < tol(dt));
      Dual g = dual_random(cpu, gpu, Shape{rows, F}, dt, 4);
      Dual dx = dual_empty(cpu, gpu, Shape{rows, 2 * F}, dt);
      ops::swiglu_backward(cpu, dx.cpu, g.cpu, x.cpu);
      ops::swiglu_backward(gpu, dx.gpu, g.gpu, x.gpu);
      CHECK(scaled_error(gpu, dx) < tol(dt));
    }
  }
}

TEST_CASE("CUDA rope on strided q/k views of a fused projection", "[kernels][nn][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  // Llama GQA: H = 32, Hkv = 8, D = 128, T = 2048, theta 500000.
  const int64_t B = 2, T = 2048, H = 32, Hkv = 8, D = 128;
  for (DType dt : {DType::bf16, DType::f32}) {
    // Forward and inverse rotations each start from the same fresh data on both sides, so
    // each comparison sees exactly one bf16 rounding of the GPU's result.
    for (bool inverse : {false, true}) {
      INFO(dtype_name(dt) << (inverse ? " inverse" : " forward"));
      Dual qkv = dual_random(cpu, gpu, Shape{B, T, (H + 2 * Hkv) * D}, dt, 5);
      auto heads = [&](const Tensor& t, int64_t lo, int64_t hi) {
        return t.view(Shape{B, T, H + 2 * Hkv, D}).slice(2, lo, hi);
      };
      ops::rope_apply(cpu, heads(qkv.cpu, 0, H), 500000.0, inverse);        // q
      ops::rope_apply(gpu, heads(qkv.gpu, 0, H), 500000.0, inverse);
      ops::rope_apply(cpu, heads(qkv.cpu, H, H + Hkv), 500000.0, inverse);  // k
      ops::rope_apply(gpu, heads(qkv.gpu, H, H + Hkv), 500000.0, inverse);
      // The CPU angle is exact in double; the GPU reduces a double angle, then f32 sin/cos:
      // ~1e-6 absolute on O(1) values. bf16 adds one rounding, half an ulp (2^-8) at |x| in
      // [1, 2): 5e-3 of the scale.
      CHECK(scaled_error(gpu, qkv) < (dt == DType::bf16 ? 5e-3 : 1e-5));
    }
  }
}

TEST_CASE("CUDA embedding forward and deterministic backward at GPT-2 shapes",
          "[kernels][nn][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  const int64_t B = 4, T = 1024, C = 768, V = 50304;
  // Skewed ids: a quarter of the positions hold token 13 (one huge bucket), the rest spread
  // over a small range (many repeats) and the whole vocabulary.
  std::vector<int32_t> ids(size_t(B * T), 0);
  const std::vector<double> u = uniform_values(B * T, 9, 0, 1);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = u[i] < 0.25 ? 13 : u[i] < 0.6 ? int32_t(u[i] * 1000) : int32_t(u[i] * (V - 1));
  Tensor idx_cpu = ops::from_host<int32_t>(cpu, ids, Shape{B, T});
  Tensor idx_gpu = ops::to_device(gpu, idx_cpu, gpu.device());
  for (DType dt : {DType::bf16, DType::f32}) {
    INFO(dtype_name(dt));
    Dual wte = dual_random(cpu, gpu, Shape{V, C}, dt, 10);
    Dual wpe = dual_random(cpu, gpu, Shape{T, C}, dt, 11);
    Dual out = dual_empty(cpu, gpu, Shape{B, T, C}, dt);
    ops::embedding_forward(cpu, out.cpu, idx_cpu, wte.cpu, wpe.cpu);
    ops::embedding_forward(gpu, out.gpu, idx_gpu, wte.gpu, wpe.gpu);
    CHECK(scaled_error(gpu, out) < tol(dt));

    Dual dout = dual_random(cpu, gpu, Shape{B, T, C}, dt, 12);
    Dual dwte = dual_full(cpu, gpu, Shape{V, C}, DType::f32, 0.25);
    Dual dwpe = dual_full(cpu, gpu, Shape{T, C}, DType::f32, 0.25);
    ops::embedding_backward(cpu, dwte.cpu, dwpe.cpu, dout.cpu, idx_cpu);
    ops::embedding_backward(gpu, dwte.gpu, dwpe.gpu, dout.gpu, idx_gpu);
    // Token 13's row sums ~1000 terms: f32 order differences stay near 1e-6 of the scale.
    CHECK(scaled_error(gpu, dwte) < 1e-5);
    CHECK(scaled_error(gpu, dwpe) < 1e-5);
    Tensor again = ops::full(gpu, Shape{V, C}, DType::f32, 0.25);
    ops::embedding_backward(gpu, again, Tensor(), dout.gpu, idx_gpu);
    CHECK(same_bits(gpu, again, dwte.gpu));
  }
  // One token at 6000 of 8192 positions: a bucket too large for the shared-memory sort.
  std::vector<int32_t> many(size_t(8192), 0);
  for (size_t i = 0; i < many.size(); ++i) many[i] = i % 4 == 3 ? int32_t(i % 977) : 5;
  Tensor many_cpu = ops::from_host<int32_t>(cpu, many, Shape{8, 1024});
  Tensor many_gpu = ops::to_device(gpu, many_cpu, gpu.device());
  Dual dout = dual_random(cpu, gpu, Shape{8, 1024, 64}, DType::f32, 15);
  Dual dwte = dual_full(cpu, gpu, Shape{1000, 64}, DType::f32, 0.0);
  ops::embedding_backward(cpu, dwte.cpu, Tensor(), dout.cpu, many_cpu);
  ops::embedding_backward(gpu, dwte.gpu, Tensor(), dout.gpu, many_gpu);
  CHECK(scaled_error(gpu, dwte) < 1e-5);  // token 5 sums 6144 rows: f32 order differences
  Tensor again = ops::zeros(gpu, Shape{1000, 64}, DType::f32);
  ops::embedding_backward(gpu, again, Tensor(), dout.gpu, many_gpu);
  CHECK(same_bits(gpu, again, dwte.gpu));
}

TEST_CASE("CUDA fused cross-entropy over GPT-2's padded vocabulary", "[kernels][nn][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  const int64_t N = 1024, V = 50257, Vp = 50304;
  std::vector<int32_t> t(size_t(N), 0);
  const std::vector<double> u = uniform_values(N, 13, 0, 1);
  for (size_t i = 0; i < t.size(); ++i) t[i] = i % 7 == 3 ? -1 : int32_t(u[i] * (V - 1));
  t[1] = V - 1;  // the last real class
  Tensor tgt_cpu = ops::from_host<int32_t>(cpu, t, Shape{N});
  Tensor tgt_gpu = ops::to_device(gpu, tgt_cpu, gpu.device());
  for (DType dt : {DType::bf16, DType::f32}) {
    INFO(dtype_name(dt));
    Dual logits = dual_random(cpu, gpu, Shape{N, Vp}, dt, 14, -8, 8);
    ops::fill(gpu, logits.gpu.slice(1, V, Vp), 100.0);  // padding must not count
    ops::fill(cpu, logits.cpu.slice(1, V, Vp), 100.0);
    Dual losses = dual_empty(cpu, gpu, Shape{N}, DType::f32);
    Dual lse = dual_empty(cpu, gpu, Shape{N}, DType::f32);
    ops::cross_entropy_forward(cpu, losses.cpu, lse.cpu, logits.cpu, tgt_cpu, V);
    ops::cross_entropy_forward(gpu, losses.gpu, lse.gpu, logits.gpu, tgt_gpu, V);
    // f32 sums of 50257 exponentials (fast exp on the GPU): 1e-5 of the scale.
    CHECK(scaled_error(gpu, lse) < 1e-5);
    CHECK(scaled_error(gpu, losses) < 1e-5);
    CHECK(values(gpu, losses.gpu)[3] == 0.0);  // ignored row
    // In place, the way the classifier runs it.
    const double dloss = 1.0 / double(N);
    ops::cross_entropy_backward(cpu, logits.cpu, logits.cpu, lse.cpu, tgt_cpu, V, dloss);
    ops::cross_entropy_backward(gpu, logits.gpu, logits.gpu, lse.gpu, tgt_gpu, V, dloss);
    CHECK(scaled_error(gpu, logits) < tol(dt));
    CHECK(max_abs(values(gpu, logits.gpu.slice(1, V, Vp))) == 0.0);
    CHECK(max_abs(values(gpu, logits.gpu.select(0, 3))) == 0.0);
  }
}

TEST_CASE("CUDA cross-entropy forward-backward in one pass matches the CPU and the two kernels",
          "[kernels][nn][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  // GPT-2's padded vocabulary (packed loads), and an odd width (the scalar path).
  for (auto [N, V, Vp] : {std::tuple<int64_t, int64_t, int64_t>{777, 50257, 50304},
                          {300, 1000, 1001}}) {
    std::vector<int32_t> t(size_t(N), 0);
    const std::vector<double> u = uniform_values(N, 16, 0, 1);
    for (size_t i = 0; i < t.size(); ++i) t[i] = i % 5 == 2 ? -1 : int32_t(u[i] * (V - 1));
    t[0] = int32_t(V - 1);  // the last real class
    Tensor tgt_cpu = ops::from_host<int32_t>(cpu, t, Shape{N});
    Tensor tgt_gpu = ops::to_device(gpu, tgt_cpu, gpu.device());
    for (DType dt : {DType::bf16, DType::f32}) {
      INFO(N << "x" << Vp << " " << dtype_name(dt));
      Dual logits = dual_random(cpu, gpu, Shape{N, Vp}, dt, 17, -8, 8);
      ops::fill(gpu, logits.gpu.slice(1, V, Vp), 100.0);  // padding must not count
      ops::fill(cpu, logits.cpu.slice(1, V, Vp), 100.0);
      const double dloss = 1.0 / double(N);
      // The GPU's two-kernel path on a copy: the fused kernel merges the block's partial
      // sums in the same order, so it must agree bit for bit.
      Tensor two = ops::clone(gpu, logits.gpu);
      Tensor two_losses = ops::empty(gpu, Shape{N}, DType::f32);
      Tensor two_lse = ops::empty(gpu, Shape{N}, DType::f32);
      ops::cross_entropy_forward(gpu, two_losses, two_lse, two, tgt_gpu, V);
      ops::cross_entropy_backward(gpu, two, two, two_lse, tgt_gpu, V, dloss);

      // Losses only: the logits stay.
      Tensor kept = ops::clone(gpu, logits.gpu);
      Dual losses = dual_empty(cpu, gpu, Shape{N}, DType::f32);
      ops::cross_entropy_forward_backward(gpu, losses.gpu, kept, tgt_gpu, V, dloss, false);
      CHECK(same_bits(gpu, kept, logits.gpu));
      CHECK(same_bits(gpu, losses.gpu, two_losses));

      ops::cross_entropy_forward_backward(cpu, losses.cpu, logits.cpu, tgt_cpu, V, dloss, true);
      ops::cross_entropy_forward_backward(gpu, losses.gpu, logits.gpu, tgt_gpu, V, dloss, true);
      CHECK(scaled_error(gpu, losses) < 1e-5);  // f32 sums of exponentials (fast exp)
      CHECK(scaled_error(gpu, logits) < tol(dt));
      CHECK(same_bits(gpu, losses.gpu, two_losses));
      CHECK(same_bits(gpu, logits.gpu, two));
      CHECK(values(gpu, losses.gpu)[2] == 0.0);  // ignored row
      CHECK(max_abs(values(gpu, logits.gpu.slice(1, V, Vp))) == 0.0);
      CHECK(max_abs(values(gpu, logits.gpu.select(0, 2))) == 0.0);
    }
  }
}

TEST_CASE("CUDA AdamW matches the CPU over three steps", "[kernels][nn][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  const int64_t n = (1 << 20) + 3;
  for (DType moments : {DType::f32, DType::bf16}) {
    for (DType grads : {DType::bf16, DType::f32}) {
      INFO("moments " << dtype_name(moments) << " grads " << dtype_name(grads));
      Dual p = dual_random(cpu, gpu, Shape{n}, DType::f32, 15);
      Tensor m_cpu = ops::zeros(cpu, Shape{n}, moments), v_cpu = ops::zeros(cpu, Shape{n}, moments);
      Tensor m_gpu = ops::zeros(gpu, Shape{n}, moments), v_gpu = ops::zeros(gpu, Shape{n}, moments);
      Tensor copy = ops::empty(gpu, Shape{n}, DType::bf16);
      ops::AdamWParams a;
      a.lr = 3e-3;
      a.weight_decay = 0.1;
      a.grad_scale = 0.5;
      for (int64_t s = 1; s <= 3; ++s) {
        a.step = s;
        Tensor g = random_tensor(cpu, Shape{n}, grads, uint32_t(20 + s), -1, 1);
        ops::adamw_step(cpu, p.cpu, g, m_cpu, v_cpu, a);
        ops::adamw_step(gpu, p.gpu, ops::to_device(gpu, g, gpu.device()), m_gpu, v_gpu, a, copy);
      }
      // The CPU computes in double, the GPU in f32: with f32 moments the parameters agree to
      // f32 rounding of the updates (steps of ~lr = 3e-3 on O(1) weights), far below 1e-6 of
      // the scale. With bf16 moments a moment near a bf16 rounding boundary may round one ulp
      // (2^-8 relative) apart on the two sides, moving that step's update by ~lr * 2^-7:
      // over 3 steps at most ~1e-4 of the scale.
      CHECK(scaled_error(gpu, p) < (moments == DType::bf16 ? 1e-4 : 1e-6));
      CHECK(scaled_error(gpu, m_gpu, m_cpu) < (moments == DType::bf16 ? 1e-2 : 1e-5));
      // The bf16 copy is exactly the GPU's updated parameter, rounded.
      CHECK(same_bits(gpu, copy, ops::cast(gpu, p.gpu, DType::bf16)));
    }
  }
}

TEST_CASE("CUDA AdamW matches the host's f32 AdamW (CPU offload) to the last bits",
          "[kernels][nn][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  const int64_t n = (1 << 20) + 3;
  for (DType moments : {DType::f32, DType::bf16}) {
    INFO("moments " << dtype_name(moments));
    Dual p = dual_random(cpu, gpu, Shape{n}, DType::f32, 16);
    Tensor m_cpu = ops::zeros(cpu, Shape{n}, moments), v_cpu = ops::zeros(cpu, Shape{n}, moments);
    Tensor m_gpu = ops::zeros(gpu, Shape{n}, moments), v_gpu = ops::zeros(gpu, Shape{n}, moments);
    Tensor copy_cpu = ops::empty(cpu, Shape{n}, DType::bf16), copy_gpu = ops::empty(gpu, Shape{n}, DType::bf16);
    ops::AdamWParams a;
    a.lr = 3e-3;
    a.weight_decay = 0.1;
    a.grad_scale = 0.5;
    for (int64_t s = 1; s <= 3; ++s) {
      a.step = s;
      Tensor g = random_tensor(cpu, Shape{n}, DType::bf16, uint32_t(30 + s), -1, 1);
      ops::adamw_step_host_f32(cpu, p.cpu, g, m_cpu, v_cpu, a, copy_cpu);
      ops::adamw_step(gpu, p.gpu, ops::to_device(gpu, g, gpu.device()), m_gpu, v_gpu, a, copy_gpu);
    }
    // Both compute in f32 with the same formula; nvcc may fuse a multiply and an add into
    // one FMA where the host rounds twice, so the last bit of a few elements can differ:
    // 1e-6 of the scale with f32 moments. With bf16 moments such a last-bit difference can
    // round a moment one bf16 ulp (2^-8 relative) apart, moving that step's update by
    // ~lr * 2^-7 (as in the CPU-reference test above): 1e-4 of the scale over 3 steps.
    CHECK(scaled_error(gpu, p) < (moments == DType::bf16 ? 1e-4 : 1e-6));
    CHECK(scaled_error(gpu, m_gpu, m_cpu) < (moments == DType::bf16 ? 1e-2 : 1e-6));
    const auto cc = values(cpu, copy_cpu), cg = values(gpu, copy_gpu);
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i) differ += cc[size_t(i)] != cg[size_t(i)];
    CHECK(differ <= n / 1000);
  }
}

TEST_CASE("CUDA initializers: slice invariance, moments, agreement with the CPU",
          "[kernels][nn][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  const uint64_t seed = 42, key = ops::name_key("transformer.h.3.mlp.c_fc.weight");
  const int64_t n = 3072 * 768;
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor full = ops::empty(gpu, Shape{n}, dt);
    ops::init_normal(gpu, full, seed, key, 0, 0.0, 0.02);
    for (int64_t off : {int64_t(0), int64_t(1), int64_t(n / 2 + 1)}) {
      Tensor part = ops::empty(gpu, Shape{4097}, dt);
      ops::init_normal(gpu, part, seed, key, off, 0.0, 0.02);
      CHECK(same_bits(gpu, part, full.narrow(0, off, 4097)));
    }
    const auto v = values(gpu, full);
    double mean = 0, var = 0;
    for (double x : v) mean += x / double(n);
    for (double x : v) var += (x - mean) * (x - mean) / double(n);
    CHECK(std::fabs(mean) < 5 * 0.02 / std::sqrt(double(n)));
    CHECK(std::fabs(std::sqrt(var) - 0.02) < 0.02 * 5e-3);
    // Same generator and double math on both devices: equal up to the last bit of libm.
    Tensor host = ops::empty(cpu, Shape{n}, dt);
    ops::init_normal(cpu, host, seed, key, 0, 0.0, 0.02);
    CHECK(scaled_error(gpu, full, host) < 1e-6);
    Tensor uni = ops::empty(gpu, Shape{n}, dt), uni_host = ops::empty(cpu, Shape{n}, dt);
    ops::init_uniform(gpu, uni, seed, key, 0, -0.5, 0.5);
    ops::init_uniform(cpu, uni_host, seed, key, 0, -0.5, 0.5);
    CHECK(scaled_error(gpu, uni, uni_host) < 1e-6);
  }
}
