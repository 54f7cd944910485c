// Our own causal grouped-query attention on CUDA : the fallback
// where cuDNN's fused attention cannot run (f32, unusual head sizes or strides, no cuDNN).
// Correctness first: one warp per query row (forward, dq) or key row (dk, dv) with an online
// softmax over 32-key tiles; no atomics, so results are deterministic. Each lane owns head
// dimensions lane, lane + 32, ... (up to kMaxDimsPerLane of them).
#include <cmath>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/vec.cuh"

namespace fsdp::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxDimsPerLane = 16;  // head_dim <= 512

template <typename T>
__device__ __forceinline__ const T* row_of(const T* base, const HeadStrides& s, int64_t b,
                                           int64_t t, int64_t h) {
  return base + b * s.b + t * s.t + h * s.h;
}

// a (D floats, shared) . r (D elements of T)
template <typename T>
__device__ __forceinline__ float dot_row(const float* a, const T* r, int64_t D) {
  float acc = 0;
  for (int64_t i = 0; i < D; ++i) acc += a[i] * to_float(r[i]);
  return acc;
}

template <typename T, int DPL>
__global__ void forward_kernel(AttentionDims d, T* out, float* lse, const T* q, const T* k,
                               const T* v) {
  extern __shared__ float smem[];  // (warps, D): this warp's query row, pre-scaled
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  const int64_t b = blockIdx.y / d.heads, h = blockIdx.y % d.heads, kvh = h / d.group();
  if (t >= d.seq) return;
  const int64_t D = d.head_dim;
  float* qs = smem + warp * D;
  const T* qr = row_of(q, d.q, b, t, h);
  for (int64_t i = lane; i < D; i += kWarp) qs[i] = to_float(qr[i]) * float(d.scale);
  __syncwarp();
  const int64_t last = d.last_key(t);  // the last key this query sees
  float m = -INFINITY, l = 0.f, acc[DPL] = {};
  for (int64_t j0 = 0; j0 <= last; j0 += kWarp) {
    const int64_t j = j0 + lane;
    const float s = j <= last ? dot_row(qs, row_of(k, d.k, b, j, kvh), D) : -INFINITY;
    const float m_new = fmaxf(m, warp_max(s));
    const float p = j <= last ? expf(s - m_new) : 0.f;
    const float correction = expf(m - m_new);
    l = l * correction + warp_sum(p);
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] *= correction;
    const int64_t tile = min(int64_t(kWarp), last - j0 + 1);
    for (int64_t jj = 0; jj < tile; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, p, int(jj));
      const T* vr = row_of(v, d.v, b, j0 + jj, kvh);
#pragma unroll
      for (int i = 0; i < DPL; ++i)
        if (lane + i * kWarp < D) acc[i] += pj * to_float(vr[lane + i * kWarp]);
    }
    m = m_new;
  }
  T* o = out + b * d.out.b + t * d.out.t + h * d.out.h;
#pragma unroll
  for (int i = 0; i < DPL; ++i)
    if (lane + i * kWarp < D) o[lane + i * kWarp] = from_float<T>(acc[i] / l);
  if (lane == 0) lse[(b * d.heads + h) * d.seq + t] = m + logf(l);
}

// delta (B, H, T) = dout . out per query row.
template <typename T>
__global__ void delta_kernel(AttentionDims d, float* delta, const T* dout, const T* out) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  const int64_t b = blockIdx.y / d.heads, h = blockIdx.y % d.heads;
  if (t >= d.seq) return;
  const T* g = row_of(dout, d.dout, b, t, h);
  const T* o = row_of(out, d.out, b, t, h);
  float acc = 0;
  for (int64_t i = lane; i < d.head_dim; i += kWarp) acc += to_float(g[i]) * to_float(o[i]);
  acc = warp_sum(acc);
  if (lane == 0) delta[(b * d.heads + h) * d.seq + t] = acc;
}

// dq[t] = scale * sum_j dS[t, j] k[j], with dS = P (dP - delta), dP = dout . v.
template <typename T, int DPL>
__global__ void dq_kernel(AttentionDims d, T* dq, const T* dout, const float* lse,
                          const float* delta, const T* q, const T* k, const T* v) {
  extern __shared__ float smem[];  // (warps, 2, D): scaled q row, dout row
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  const int64_t b = blockIdx.y / d.heads, h = blockIdx.y % d.heads, kvh = h / d.group();
  if (t >= d.seq) return;
  const int64_t D = d.head_dim;
  float* qs = smem + warp * 2 * D;
  float* gs = qs + D;
  const T* qr = row_of(q, d.q, b, t, h);
  const T* gr = row_of(dout, d.dout, b, t, h);
  for (int64_t i = lane; i < D; i += kWarp) {
    qs[i] = to_float(qr[i]) * float(d.scale);
    gs[i] = to_float(gr[i]);
  }
  __syncwarp();
  const int64_t row = (b * d.heads + h) * d.seq + t;
  const float lse_t = lse[row], delta_t = delta[row];
  const int64_t last = d.last_key(t);  // the last key this query sees
  float acc[DPL] = {};
  for (int64_t j0 = 0; j0 <= last; j0 += kWarp) {
    const int64_t j = j0 + lane;
    float ds = 0.f;
    if (j <= last) {
      const float p = expf(dot_row(qs, row_of(k, d.k, b, j, kvh), D) - lse_t);
      ds = p * (dot_row(gs, row_of(v, d.v, b, j, kvh), D) - delta_t);
    }
    const int64_t tile = min(int64_t(kWarp), last - j0 + 1);
    for (int64_t jj = 0; jj < tile; ++jj) {
      const float dsj = __shfl_sync(0xffffffffu, ds, int(jj));
      const T* kr = row_of(k, d.k, b, j0 + jj, kvh);
#pragma unroll
      for (int i = 0; i < DPL; ++i)
        if (lane + i * kWarp < D) acc[i] += dsj * to_float(kr[lane + i * kWarp]);
    }
  }
  T* o = dq + b * d.dq.b + t * d.dq.t + h * d.dq.h;
#pragma unroll
  for (int i = 0; i < DPL; ++i)
    if (lane + i * kWarp < D) o[lane + i * kWarp] = from_float<T>(acc[i] * float(d.scale));
}

// For key row j of key/value head kvh, over the query heads that share it and the queries
// that see it (past + t >= j): dv[j] = sum P[t, j] dout[t]; dk[j] = scale * sum dS[t, j] q[t].
template <typename T, int DPL>
__global__ void dkdv_kernel(AttentionDims d, T* dk, T* dv, const T* dout, const float* lse,
                            const float* delta, const T* q, const T* k, const T* v) {
  extern __shared__ float smem[];  // (warps, 2, D): scaled k row, v row
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t j = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  const int64_t b = blockIdx.y / d.kv_heads, kvh = blockIdx.y % d.kv_heads;
  if (j >= d.past + d.seq) return;
  const int64_t D = d.head_dim;
  float* ks = smem + warp * 2 * D;
  float* vs = ks + D;
  const T* kr = row_of(k, d.k, b, j, kvh);
  const T* vr = row_of(v, d.v, b, j, kvh);
  for (int64_t i = lane; i < D; i += kWarp) {
    ks[i] = to_float(kr[i]) * float(d.scale);
    vs[i] = to_float(vr[i]);
  }
  __syncwarp();
  float dk_acc[DPL] = {}, dv_acc[DPL] = {};
  for (int64_t h = kvh * d.group(); h < (kvh + 1) * d.group(); ++h) {
    for (int64_t t0 = d.first_query(j); t0 < d.seq; t0 += kWarp) {
      const int64_t t = t0 + lane;
      float p = 0.f, ds = 0.f;
      if (t < d.seq) {
        const int64_t row = (b * d.heads + h) * d.seq + t;
        p = expf(dot_row(ks, row_of(q, d.q, b, t, h), D) - lse[row]);
        ds = p * (dot_row(vs, row_of(dout, d.dout, b, t, h), D) - delta[row]);
      }
      const int64_t tile = min(int64_t(kWarp), d.seq - t0);
      for (int64_t tt = 0; tt < tile; ++tt) {
        const float pt = __shfl_sync(0xffffffffu, p, int(tt));
        const float dst = __shfl_sync(0xffffffffu, ds, int(tt));
        const T* qr = row_of(q, d.q, b, t0 + tt, h);
        const T* gr = row_of(dout, d.dout, b, t0 + tt, h);
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
          const int64_t c = lane + i * kWarp;
          if (c < D) {
            dv_acc[i] += pt * to_float(gr[c]);
            dk_acc[i] += dst * to_float(qr[c]);
          }
        }
      }
    }
  }
  T* dko = dk + b * d.dk.b + j * d.dk.t + kvh * d.dk.h;
  T* dvo = dv + b * d.dv.b + j * d.dv.t + kvh * d.dv.h;
#pragma unroll
  for (int i = 0; i < DPL; ++i) {
    const int64_t c = lane + i * kWarp;
    if (c < D) {
      dko[c] = from_float<T>(dk_acc[i] * float(d.scale));
      dvo[c] = from_float<T>(dv_acc[i]);
    }
  }
}

// Per element of out (B, T, H, D): the merged row's weights from the two log-sum-exps (each
// thread recomputes them; lse itself is updated by the next kernel, after every read).
template <typename T>
__global__ void merge_out_kernel(float* out, const float* lse, const T* block_out,
                                 const float* block_lse, int64_t seq, int64_t heads, int64_t D,
                                 int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = (i / D) % heads, t = (i / (D * heads)) % seq, b = i / (D * heads * seq);
    const int64_t row = (b * heads + h) * seq + t;
    const float a = lse[row], c = block_lse[row], m = fmaxf(a, c);
    if (m == -INFINITY) continue;
    const float merged = m + logf(expf(a - m) + expf(c - m));
    out[i] = out[i] * expf(a - merged) + to_float(block_out[i]) * expf(c - merged);
  }
}

__global__ void merge_lse_kernel(float* lse, const float* block_lse, int64_t rows) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += int64_t(gridDim.x) * blockDim.x) {
    const float a = lse[r], c = block_lse[r], m = fmaxf(a, c);
    if (m != -INFINITY) lse[r] = m + logf(expf(a - m) + expf(c - m));
  }
}

// f(std::integral_constant<int, DPL>) with the smallest power of two DPL >= head_dim / 32.
template <typename F>
void dispatch_dims_per_lane(int64_t head_dim, F&& f) {
  FSDP_CHECK(head_dim >= 1 && head_dim <= kWarp * kMaxDimsPerLane, ValueError,
             "attention (CUDA fallback): head_dim ", head_dim, " is outside [1, ",
             kWarp * kMaxDimsPerLane, "]");
  if (head_dim <= 32) return f(std::integral_constant<int, 1>{});
  if (head_dim <= 64) return f(std::integral_constant<int, 2>{});
  if (head_dim <= 128) return f(std::integral_constant<int, 4>{});
  if (head_dim <= 256) return f(std::integral_constant<int, 8>{});
  return f(std::integral_constant<int, 16>{});
}

dim3 grid_of(int64_t rows, int64_t heads_total) {
  FSDP_CHECK(heads_total <= 65535, ValueError, "attention (CUDA fallback): batch * heads = ",
             heads_total, " exceeds 65535");
  return dim3(unsigned((rows + kWarpsPerBlock - 1) / kWarpsPerBlock), unsigned(heads_total));
}

}  // namespace

void attention_forward(const AttentionDims& d, void* out, float* lse, const void* q, const void* k,
                       const void* v, DType dtype, stream_t stream) {
  if (d.batch * d.seq * d.heads == 0) return;
  dispatch_compute(dtype, "attention_forward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_dims_per_lane(d.head_dim, [&](auto dpl) {
      constexpr int DPL = decltype(dpl)::value;
      const size_t shared = size_t(kWarpsPerBlock * d.head_dim) * sizeof(float);
      forward_kernel<T, DPL><<<grid_of(d.seq, d.batch * d.heads), kWarpsPerBlock * kWarp, shared,
                               stream>>>(d, static_cast<T*>(out), lse, static_cast<const T*>(q),
                                         static_cast<const T*>(k), static_cast<const T*>(v));
      FSDP_CHECK_LAUNCH();
    });
  });
}

size_t attention_backward_workspace_bytes(const AttentionDims& d) {
  return size_t(d.batch * d.heads * d.seq) * sizeof(float);
}

void attention_backward(const AttentionDims& d, void* dq, void* dk, void* dv, const void* dout,
                        const void* out, const float* lse, const void* q, const void* k,
                        const void* v, DType dtype, void* workspace, stream_t stream) {
  if (d.batch * d.seq * d.heads == 0) return;
  float* delta = static_cast<float*>(workspace);
  dispatch_compute(dtype, "attention_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* qt = static_cast<const T*>(q);
    const T* kt = static_cast<const T*>(k);
    const T* vt = static_cast<const T*>(v);
    const T* gt = static_cast<const T*>(dout);
    const unsigned threads = kWarpsPerBlock * kWarp;
    delta_kernel<T><<<grid_of(d.seq, d.batch * d.heads), threads, 0, stream>>>(
        d, delta, gt, static_cast<const T*>(out));
    FSDP_CHECK_LAUNCH();
    dispatch_dims_per_lane(d.head_dim, [&](auto dpl) {
      constexpr int DPL = decltype(dpl)::value;
      const size_t shared = size_t(kWarpsPerBlock * 2 * d.head_dim) * sizeof(float);
      dq_kernel<T, DPL><<<grid_of(d.seq, d.batch * d.heads), threads, shared, stream>>>(
          d, static_cast<T*>(dq), gt, lse, delta, qt, kt, vt);
      FSDP_CHECK_LAUNCH();
      dkdv_kernel<T, DPL><<<grid_of(d.past + d.seq, d.batch * d.kv_heads), threads, shared, stream>>>(
          d, static_cast<T*>(dk), static_cast<T*>(dv), gt, lse, delta, qt, kt, vt);
      FSDP_CHECK_LAUNCH();
    });
  });
}

void attention_merge(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, float* out,
                     float* lse, const void* block_out, const float* block_lse, DType dtype,
                     stream_t stream) {
  const int64_t rows = batch * seq * heads, n = rows * head_dim;
  if (n == 0) return;
  constexpr int kThreads = 256;
  dispatch_compute(dtype, "attention_merge", [&](auto tag) {
    using T = decltype(tag);
    merge_out_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        out, lse, static_cast<const T*>(block_out), block_lse, seq, heads, head_dim, n);
    FSDP_CHECK_LAUNCH();
  });
  merge_lse_kernel<<<grid_for(rows, kThreads), kThreads, 0, stream>>>(lse, block_lse, rows);
  FSDP_CHECK_LAUNCH();
}

}  // namespace fsdp::kernels::cuda
