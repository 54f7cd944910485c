#include "kernels/cuda/attention_gemm.h"

#include <algorithm>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vec.cuh"

namespace fsdp::kernels::cuda {
namespace {

constexpr int kThreads = 256;
// The (T, T) score buffers of at most this many bytes per chunk of (b, h) problems.
constexpr size_t kScoresBytes = size_t(256) << 20;

// dst (B, H, T, D) contiguous <- src (B, T, Hs, D) with strides s: head h reads source head
// h / group (group > 1 repeats a key/value head for the query heads that share it).
__global__ void pack_heads_kernel(float* dst, const float* src, HeadStrides s, int64_t B,
                                  int64_t H, int64_t T, int64_t D, int64_t group) {
  const int64_t n = B * H * T * D;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % D, t = (i / D) % T, h = (i / (D * T)) % H, b = i / (D * T * H);
    dst[i] = src[b * s.b + t * s.t + (h / group) * s.h + d];
  }
}

// dst (B, T, Hd, D) with strides s <- src (B, Hd * group, T, D): the sum over the `group`
// heads h = hd * group + g (in order g = 0, 1, ...: deterministic).
__global__ void unpack_heads_kernel(float* dst, HeadStrides s, const float* src, int64_t B,
                                    int64_t Hd, int64_t T, int64_t D, int64_t group) {
  const int64_t n = B * Hd * T * D;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % D, t = (i / D) % T, hd = (i / (D * T)) % Hd, b = i / (D * T * Hd);
    float acc = 0.f;
    for (int64_t g = 0; g < group; ++g)
      acc += src[(((b * Hd + hd) * group + g) * T + t) * D + d];
    dst[b * s.b + t * s.t + hd * s.h + d] = acc;
  }
}

// One block per score row t of problem p: P = softmax over keys j <= t of S (scaled
// already), written over S, zero for j > t; lse[p, t] = max + log(sum).
__global__ void causal_softmax_kernel(float* S, float* lse, int64_t T) {
  const int64_t row = blockIdx.x;  // p * T + t
  const int64_t t = row % T;
  float* s = S + row * T;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j <= t; j += blockDim.x) m = fmaxf(m, s[j]);
  m = block_max(m);
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j <= t; j += blockDim.x) sum += expf(s[j] - m);
  sum = block_sum(sum);
  const float inv = 1.f / sum;
  for (int64_t j = threadIdx.x; j < T; j += blockDim.x) s[j] = j <= t ? expf(s[j] - m) * inv : 0.f;
  if (threadIdx.x == 0) lse[row] = m + logf(sum);
}

// delta[r] = dout[r, :] . out[r, :] for rows r of D floats (packed layouts), one warp each.
__global__ void row_dot_kernel(float* delta, const float* a, const float* b, int64_t rows,
                               int64_t D) {
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  float acc = 0.f;
  for (int64_t i = lane; i < D; i += kWarp) acc += a[r * D + i] * b[r * D + i];
  acc = warp_sum(acc);
  if (lane == 0) delta[r] = acc;
}

// Backward of the softmax, one block per row t: P = exp(S - lse) for j <= t (else 0) over
// S, and dS = P (dP - delta) over dP.
__global__ void softmax_backward_kernel(float* S, float* dP, const float* lse,
                                        const float* delta, int64_t T) {
  const int64_t row = blockIdx.x;
  const int64_t t = row % T;
  float* s = S + row * T;
  float* dp = dP + row * T;
  const float l = lse[row], dl = delta[row];
  for (int64_t j = threadIdx.x; j < T; j += blockDim.x) {
    const float p = j <= t ? expf(s[j] - l) : 0.f;
    s[j] = p;
    dp[j] = p * (dp[j] - dl);
  }
}

// The (b, h) problems per chunk: as many as fit kScoresBytes of (T, T) scores (per buffer).
int64_t chunk_problems(const AttentionDims& d) {
  const size_t per = size_t(d.seq) * size_t(d.seq) * sizeof(float);
  return std::max<int64_t>(1, std::min<int64_t>(d.batch * d.heads, int64_t(kScoresBytes / per)));
}

size_t packed_floats(const AttentionDims& d) { return size_t(d.batch * d.heads * d.seq * d.head_dim); }

void pack(float* dst, const float* src, const HeadStrides& s, const AttentionDims& d,
          int64_t group, stream_t stream) {
  pack_heads_kernel<<<grid_for(int64_t(packed_floats(d)), kThreads), kThreads, 0, stream>>>(
      dst, src, s, d.batch, d.heads, d.seq, d.head_dim, group);
  FSDP_CHECK_LAUNCH();
}

void unpack(float* dst, const HeadStrides& s, const float* src, const AttentionDims& d,
            int64_t heads, int64_t group, stream_t stream) {
  unpack_heads_kernel<<<grid_for(d.batch * heads * d.seq * d.head_dim, kThreads), kThreads, 0,
                        stream>>>(dst, s, src, d.batch, heads, d.seq, d.head_dim, group);
  FSDP_CHECK_LAUNCH();
}

// out[p] = alpha op(a[p]) op(b[p]) for the `n` problems of a chunk, (T|D) matrices packed.
void batched(Blas& blas, float* out, const float* a, const float* b, int64_t m, int64_t n_cols,
             int64_t k, bool trans_a, bool trans_b, int64_t problems, double alpha) {
  MatmulDims dims;
  dims.m = m;
  dims.n = n_cols;
  dims.k = k;
  dims.trans_a = trans_a;
  dims.trans_b = trans_b;
  dims.batch = problems;
  dims.batch_stride_a = m * k;
  dims.batch_stride_b = k * n_cols;
  dims.batch_stride_out = m * n_cols;
  blas.matmul(dims, out, DType::f32, a, b, DType::f32, alpha, 0.0, nullptr, nullptr,
              MatmulEpilogue::None);
}

// Workspace layout (floats): packed buffers, then scores, then (backward) dP and delta.
struct Workspace {
  float *q, *k, *v, *o, *dout, *dq, *dk, *dv, *scores, *dscores, *delta;
};
Workspace carve(const AttentionDims& d, void* base, bool backward) {
  float* p = static_cast<float*>(base);
  const size_t packed = packed_floats(d);
  const size_t scores = size_t(chunk_problems(d)) * size_t(d.seq * d.seq);
  Workspace w{};
  for (float** slot : {&w.q, &w.k, &w.v, &w.o}) { *slot = p; p += packed; }
  w.scores = p;
  p += scores;
  if (!backward) return w;
  for (float** slot : {&w.dout, &w.dq, &w.dk, &w.dv}) { *slot = p; p += packed; }
  w.dscores = p;
  p += scores;
  w.delta = p;
  return w;
}

}  // namespace

size_t attention_gemm_workspace_bytes(const AttentionDims& d, bool backward) {
  const size_t packed = packed_floats(d);
  const size_t scores = size_t(chunk_problems(d)) * size_t(d.seq * d.seq);
  const size_t floats = backward ? 8 * packed + 2 * scores + size_t(d.batch * d.heads * d.seq)
                                 : 4 * packed + scores;
  return floats * sizeof(float);
}

void attention_gemm_forward(Blas& blas, const AttentionDims& d, float* out, float* lse,
                            const float* q, const float* k, const float* v, void* workspace,
                            stream_t stream) {
  if (d.batch * d.seq * d.heads == 0) return;
  const Workspace w = carve(d, workspace, false);
  pack(w.q, q, d.q, d, 1, stream);
  pack(w.k, k, d.k, d, d.group(), stream);
  pack(w.v, v, d.v, d, d.group(), stream);
  const int64_t T = d.seq, D = d.head_dim, chunk = chunk_problems(d);
  for (int64_t p0 = 0; p0 < d.batch * d.heads; p0 += chunk) {
    const int64_t n = std::min(chunk, d.batch * d.heads - p0);
    const int64_t off = p0 * T * D;
    batched(blas, w.scores, w.q + off, w.k + off, T, T, D, false, true, n, d.scale);  // (n, T, T)
    causal_softmax_kernel<<<unsigned(n * T), kThreads, 0, stream>>>(w.scores, lse + p0 * T, T);
    FSDP_CHECK_LAUNCH();
    batched(blas, w.o + off, w.scores, w.v + off, T, D, T, false, false, n, 1.0);  // (n, T, D)
  }
  unpack(out, d.out, w.o, d, d.heads, 1, stream);
}

void attention_gemm_backward(Blas& blas, const AttentionDims& d, float* dq, float* dk, float* dv,
                             const float* dout, const float* out, const float* lse,
                             const float* q, const float* k, const float* v, void* workspace,
                             stream_t stream) {
  if (d.batch * d.seq * d.heads == 0) return;
  const Workspace w = carve(d, workspace, true);
  pack(w.q, q, d.q, d, 1, stream);
  pack(w.k, k, d.k, d, d.group(), stream);
  pack(w.v, v, d.v, d, d.group(), stream);
  pack(w.o, out, d.out, d, 1, stream);
  pack(w.dout, dout, d.dout, d, 1, stream);
  const int64_t T = d.seq, D = d.head_dim, rows = d.batch * d.heads * T;
  row_dot_kernel<<<unsigned((rows + 7) / 8), 8 * kWarp, 0, stream>>>(w.delta, w.dout, w.o, rows, D);
  FSDP_CHECK_LAUNCH();
  const int64_t chunk = chunk_problems(d);
  for (int64_t p0 = 0; p0 < d.batch * d.heads; p0 += chunk) {
    const int64_t n = std::min(chunk, d.batch * d.heads - p0);
    const int64_t off = p0 * T * D;
    batched(blas, w.scores, w.q + off, w.k + off, T, T, D, false, true, n, d.scale);    // S
    batched(blas, w.dscores, w.dout + off, w.v + off, T, T, D, false, true, n, 1.0);   // dP
    softmax_backward_kernel<<<unsigned(n * T), kThreads, 0, stream>>>(
        w.scores, w.dscores, lse + p0 * T, w.delta + p0 * T, T);                       // P, dS
    FSDP_CHECK_LAUNCH();
    batched(blas, w.dv + off, w.scores, w.dout + off, T, D, T, true, false, n, 1.0);     // P^T dout
    batched(blas, w.dq + off, w.dscores, w.k + off, T, D, T, false, false, n, d.scale);  // dS k
    batched(blas, w.dk + off, w.dscores, w.q + off, T, D, T, true, false, n, d.scale);   // dS^T q
  }
  unpack(dq, d.dq, w.dq, d, d.heads, 1, stream);
  unpack(dk, d.dk, w.dk, d, d.kv_heads, d.group(), stream);
  unpack(dv, d.dv, w.dv, d, d.kv_heads, d.group(), stream);
}

}  // namespace fsdp::kernels::cuda
