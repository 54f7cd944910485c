// CUDA attention (cuDNN's fused kernels and our fallback) against the CPU reference, on
// q/k/v views into one fused projection, at GPT-2 124M's shape and a Llama GQA shape.
#include <cmath>

#include "kernels/nn_ops.h"
#include "kernels/ops.h"
#include "tests/kernels/nn_cuda_test_util.h"
#include "tests/test_support.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/cudnn_attention.h"
#endif

using namespace fsdp;
using namespace fsdp::testing;

namespace {

struct Shape4 {
  int64_t B, T, H, Hkv, D;
};

// q/k/v views of a fused (B, T, (H + 2 Hkv) D) projection, as the attention layer makes them.
struct Views {
  Tensor q, k, v;
};
Views split(const Tensor& fused, const Shape4& s) {
  const Tensor h = fused.view(Shape{s.B, s.T, s.H + 2 * s.Hkv, s.D});
  return {h.slice(2, 0, s.H), h.slice(2, s.H, s.H + s.Hkv), h.slice(2, s.H + s.Hkv, s.H + 2 * s.Hkv)};
}

// Runs forward and backward on both devices and checks every output. `cudnn` selects the
// CUDA path (when false, our own kernels are forced).
void check_attention(Context& cpu, Context& gpu, const Shape4& s, DType dt, bool cudnn) {
  INFO("B " << s.B << " T " << s.T << " H " << s.H << " Hkv " << s.Hkv << " D " << s.D << " "
            << dtype_name(dt) << (cudnn ? " cuDNN" : " fallback"));
  gpu.extension<ops::KernelOptions>().use_cudnn_attention = cudnn;
  const Shape fused{s.B, s.T, (s.H + 2 * s.Hkv) * s.D};
  // Scores of O(1) after the 1/sqrt(D) scale: realistic, and the softmax is not one-hot.
  Dual qkv = dual_random(cpu, gpu, fused, dt, 1, -2, 2);
  const Views xc = split(qkv.cpu, s), xg = split(qkv.gpu, s);
  Dual out = dual_empty(cpu, gpu, Shape{s.B, s.T, s.H, s.D}, dt);
  Dual lse = dual_empty(cpu, gpu, Shape{s.B, s.H, s.T}, DType::f32);
  ops::attention_forward(cpu, out.cpu, lse.cpu, xc.q, xc.k, xc.v);
  ops::attention_forward(gpu, out.gpu, lse.gpu, xg.q, xg.k, xg.v);
  // bf16: the fused kernels round the probabilities to bf16 before P @ V and store the
  // output in bf16; errors of a few 2^-9 relative: 1e-2 of the output's scale. f32 (cuBLAS
  // matmuls around our softmax, f32 exp and sums over up to T keys): 1e-4.
  const double fwd_tol = dt == DType::bf16 ? 1e-2 : 1e-4;
  CHECK(scaled_error(gpu, out) < fwd_tol);
  CHECK(scaled_error(gpu, lse) < 1e-4);  // f32 log-sum-exp of O(1) scores, up to T terms

  Dual dout = dual_random(cpu, gpu, Shape{s.B, s.T, s.H, s.D}, dt, 2);
  Dual dqkv = dual_full(cpu, gpu, fused, dt, 7.0);  // garbage: must be overwritten
  const Views dc = split(dqkv.cpu, s), dg = split(dqkv.gpu, s);
  // Each side differentiates its own forward (the GPU's bf16 out and f32 lse).
  ops::attention_backward(cpu, dc.q, dc.k, dc.v, dout.cpu, out.cpu, lse.cpu, xc.q, xc.k, xc.v);
  ops::attention_backward(gpu, dg.q, dg.k, dg.v, dout.gpu, out.gpu, lse.gpu, xg.q, xg.k, xg.v);
  // The backward rounds P and dS to bf16 inside the fused kernels and sums T terms per
  // element (H / Hkv heads for dk, dv): 2e-2 of the scale in bf16; 1e-4 in f32.
  const double bwd_tol = dt == DType::bf16 ? 2e-2 : 1e-4;
  CHECK(scaled_error(gpu, dg.q, dc.q) < bwd_tol);
  CHECK(scaled_error(gpu, dg.k, dc.k) < bwd_tol);
  CHECK(scaled_error(gpu, dg.v, dc.v) < bwd_tol);
}

}  // namespace

TEST_CASE("CUDA attention: cuDNN and our fallback match the CPU (GPT-2 124M, Llama GQA)",
          "[kernels][nn][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  const Shape4 gpt2{4, 1024, 12, 12, 64};
  const Shape4 llama{1, 512, 32, 8, 128};
  const Shape4 odd{2, 77, 6, 3, 40};  // sequence and head size off every tile
  for (const Shape4& s : {gpt2, llama, odd}) {
    check_attention(cpu, gpu, s, DType::bf16, true);
    check_attention(cpu, gpu, s, DType::bf16, false);
    check_attention(cpu, gpu, s, DType::f32, false);
  }
#if FSDP_WITH_CUDA
  // cuDNN must actually take the bf16 GPT-2 problem on an H100/H200 with cuDNN >= 9:
  // otherwise the "cuDNN" runs above silently tested the fallback twice.
  kernels::AttentionDims d;
  d.batch = 4;
  d.seq = 1024;
  d.heads = d.kv_heads = 12;
  d.head_dim = 64;
  d.scale = 0.125;
  const int64_t row = 3 * 12 * 64;
  d.q = d.k = d.v = kernels::HeadStrides{1024 * row, row, 64};
  d.out = d.dout = d.dq = d.dk = d.dv = kernels::HeadStrides{1024 * 768, 768, 64};
  auto& cudnn = gpu.extension<kernels::cuda::CudnnAttention>();
  const bool fwd = cudnn.supports(d, DType::bf16, false);
  INFO("cuDNN refusal: " << cudnn.last_refusal());
  CHECK(fwd);
  CHECK(cudnn.supports(d, DType::bf16, true));
  CHECK_FALSE(cudnn.supports(d, DType::f32, false));  // f32 always takes our kernels
#endif
}
