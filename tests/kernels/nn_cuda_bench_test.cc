// Not pass/fail: times the CUDA kernels at GPT-2 124M training shapes (B = 16, T = 1024) and
// prints throughput next to the H200's ceilings (~780 TFLOP/s bf16 matmul, ~4.2 TB/s copy).
// Run with the [.bench] tag.
#include <cmath>
#include <cstdio>
#include <functional>

#include "kernels/ops.h"
#include "tests/kernels/nn_cuda_test_util.h"
#include "tests/test_support.h"

using namespace fsdp;
using namespace fsdp::testing;

namespace {

// Milliseconds per call of f on ctx's stream, after a warm-up call.
double time_ms(Context& ctx, const std::function<void()>& f, int reps = 20) {
  f();
  Event start = Event::create(ctx.device(), true), stop = Event::create(ctx.device(), true);
  start.record(ctx.stream());
  for (int i = 0; i < reps; ++i) f();
  stop.record(ctx.stream());
  stop.synchronize();
  return double(Event::elapsed_ms(start, stop)) / reps;
}

void report(const char* what, double ms, double tflop, double gbytes) {
  std::printf("%-44s %9.3f ms", what, ms);
  if (tflop > 0) std::printf("  %7.1f TFLOP/s", tflop / ms * 1e3);
  if (gbytes > 0) std::printf("  %7.0f GB/s", gbytes / ms * 1e3);
  std::printf("\n");
}

Tensor rand_gpu(Context& gpu, const Shape& s, DType dt, uint32_t seed, double lo = -1, double hi = 1) {
  Tensor t = ops::empty(gpu, s, dt);
  ops::init_uniform(gpu, t, seed, 7, 0, lo, hi);
  return t;
}

}  // namespace

TEST_CASE("CUDA kernel throughput at GPT-2 124M shapes", "[.bench][gpu]") {
  FSDP_REQUIRE_GPU();
  Context gpu(Device::cuda(0));
  const int64_t B = 16, T = 1024, C = 768, H = 12, D = 64, V = 50257, Vp = 50304, N = B * T;
  const DType bf = DType::bf16;
  Tensor x = rand_gpu(gpu, Shape{N, C}, bf, 1);
  Tensor w_qkv = rand_gpu(gpu, Shape{3 * C, C}, bf, 2, -0.05, 0.05);
  Tensor b_qkv = rand_gpu(gpu, Shape{3 * C}, bf, 3);
  Tensor w_fc = rand_gpu(gpu, Shape{4 * C, C}, bf, 4, -0.05, 0.05);
  Tensor b_fc = rand_gpu(gpu, Shape{4 * C}, bf, 5);
  Tensor w_proj = rand_gpu(gpu, Shape{C, 4 * C}, bf, 6, -0.05, 0.05);
  Tensor wte = rand_gpu(gpu, Shape{Vp, C}, bf, 7, -0.05, 0.05);
  Tensor qkv = ops::empty(gpu, Shape{N, 3 * C}, bf);
  Tensor h = ops::empty(gpu, Shape{N, 4 * C}, bf), pre = ops::empty(gpu, Shape{N, 4 * C}, bf);
  Tensor y = ops::empty(gpu, Shape{N, C}, bf);
  Tensor logits = ops::empty(gpu, Shape{N, Vp}, bf);
  Tensor dw_fc = ops::zeros(gpu, Shape{4 * C, C}, DType::f32);
  auto mm_flop = [](double m, double n, double k) { return 2 * m * n * k / 1e12; };

  report("matmul qkv (N x 2304 x 768) + bias", time_ms(gpu, [&] {
           ops::matmul(gpu, qkv, x, w_qkv, false, true, 1, 0, b_qkv);
         }), mm_flop(N, 3 * C, C), 0);
  report("matmul fc (N x 3072 x 768) + bias + GELU aux", time_ms(gpu, [&] {
           ops::matmul(gpu, h, x, w_fc, false, true, 1, 0, b_fc, ops::Epilogue::Gelu, pre);
         }), mm_flop(N, 4 * C, C), 0);
  report("matmul proj (N x 768 x 3072)", time_ms(gpu, [&] {
           ops::matmul(gpu, y, h, w_proj, false, true);
         }), mm_flop(N, C, 4 * C), 0);
  report("matmul classifier (N x 50304 x 768)", time_ms(gpu, [&] {
           ops::matmul(gpu, logits, y, wte, false, true);
         }, 5), mm_flop(N, Vp, C), 0);
  report("matmul dW fc += dout^T x (f32 accumulate)", time_ms(gpu, [&] {
           ops::matmul(gpu, dw_fc, h, x, true, false, 1, 1);
         }), mm_flop(4 * C, C, N), 0);
  report("matmul dx classifier (N x 768 x 50304)", time_ms(gpu, [&] {
           ops::matmul(gpu, y, logits, wte, false, false);
         }, 5), mm_flop(N, C, Vp), 0);

  Tensor fused = rand_gpu(gpu, Shape{B, T, 3 * C}, bf, 8, -2, 2);
  const Tensor heads = fused.view(Shape{B, T, 3 * H, D});
  const Tensor q = heads.slice(2, 0, H), k = heads.slice(2, H, 2 * H), v = heads.slice(2, 2 * H, 3 * H);
  Tensor att = ops::empty(gpu, Shape{B, T, H, D}, bf), lse = ops::empty(gpu, Shape{B, H, T}, DType::f32);
  Tensor dfused = ops::empty(gpu, fused.shape(), bf);
  const Tensor dheads = dfused.view(Shape{B, T, 3 * H, D});
  const Tensor dq = dheads.slice(2, 0, H), dk = dheads.slice(2, H, 2 * H), dv = dheads.slice(2, 2 * H, 3 * H);
  Tensor datt = rand_gpu(gpu, att.shape(), bf, 9);
  const double att_flop = 4.0 * B * H * T * T * D / 2 / 1e12;  // causal: half the scores
  for (bool cudnn : {true, false}) {
    gpu.extension<ops::KernelOptions>().use_cudnn_attention = cudnn;
    report(cudnn ? "attention forward (cuDNN)" : "attention forward (fallback)",
           time_ms(gpu, [&] { ops::attention_forward(gpu, att, lse, q, k, v); }, cudnn ? 20 : 2),
           att_flop, 0);
    report(cudnn ? "attention backward (cuDNN)" : "attention backward (fallback)",
           time_ms(gpu, [&] {
             ops::attention_backward(gpu, dq, dk, dv, datt, att, lse, q, k, v);
           }, cudnn ? 20 : 2), 2.5 * att_flop, 0);
  }
  gpu.extension<ops::KernelOptions>().use_cudnn_attention = true;

  Tensor ln_w = rand_gpu(gpu, Shape{C}, bf, 10), ln_b = rand_gpu(gpu, Shape{C}, bf, 11);
  Tensor mean = ops::empty(gpu, Shape{N}, DType::f32), rstd = ops::empty(gpu, Shape{N}, DType::f32);
  Tensor dx = ops::empty(gpu, Shape{N, C}, bf);
  Tensor dlw = ops::zeros(gpu, Shape{C}, DType::f32), dlb = ops::zeros(gpu, Shape{C}, DType::f32);
  const double act = double(N * C) * 2 / 1e9;  // GB of one bf16 activation
  report("layernorm forward", time_ms(gpu, [&] {
           ops::layernorm_forward(gpu, y, mean, rstd, x, ln_w, ln_b, 1e-5);
         }), 0, 2 * act);
  report("layernorm backward (+= dx, dweight, dbias)", time_ms(gpu, [&] {
           ops::layernorm_backward(gpu, dx, dlw, dlb, y, x, ln_w, mean, rstd, true, true);
         }), 0, 4 * act);
  report("gelu backward (N x 3072)", time_ms(gpu, [&] { ops::gelu_backward(gpu, h, h, pre); }), 0,
         3 * 4 * act);

  std::vector<int32_t> ids(size_t(N), 0);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 2654435761u) % V);
  Tensor idx = ops::to_device(gpu, ops::from_host<int32_t>(gpu, ids, Shape{B, T}), gpu.device());
  Tensor tgt = ops::to_device(gpu, ops::from_host<int32_t>(gpu, ids, Shape{N}), gpu.device());
  Tensor losses = ops::empty(gpu, Shape{N}, DType::f32), clse = ops::empty(gpu, Shape{N}, DType::f32);
  const double logit_gb = double(N * Vp) * 2 / 1e9;
  report("cross-entropy forward", time_ms(gpu, [&] {
           ops::cross_entropy_forward(gpu, losses, clse, logits, tgt, V);
         }), 0, logit_gb);
  report("cross-entropy backward (in place)", time_ms(gpu, [&] {
           ops::cross_entropy_backward(gpu, logits, logits, clse, tgt, V, 1.0 / N);
         }), 0, 2 * logit_gb);
  Tensor wpe = rand_gpu(gpu, Shape{T, C}, bf, 12);
  Tensor emb = ops::empty(gpu, Shape{B, T, C}, bf);
  Tensor dwte = ops::zeros(gpu, Shape{Vp, C}, DType::f32), dwpe = ops::zeros(gpu, Shape{T, C}, DType::f32);
  report("embedding forward", time_ms(gpu, [&] {
           ops::embedding_forward(gpu, emb, idx, wte, wpe);
         }), 0, 2 * act);
  report("embedding backward (deterministic)", time_ms(gpu, [&] {
           ops::embedding_backward(gpu, dwte, dwpe, emb, idx);
         }), 0, act);

  const int64_t params = 124439808;
  Tensor p = rand_gpu(gpu, Shape{params}, DType::f32, 13), g = rand_gpu(gpu, Shape{params}, DType::f32, 14);
  Tensor m = ops::zeros(gpu, Shape{params}, DType::f32), v2 = ops::zeros(gpu, Shape{params}, DType::f32);
  Tensor copy = ops::empty(gpu, Shape{params}, bf);
  ops::AdamWParams a;
  a.lr = 1e-4;
  report("adamw 124M (f32 state, bf16 copy)", time_ms(gpu, [&] {
           ops::adamw_step(gpu, p, g, m, v2, a, copy);
         }, 10), 0, double(params) * (4 * 4 + 4 * 3 + 2) / 1e9);
}
