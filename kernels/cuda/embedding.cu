// Token/position embeddings and rotary embeddings on CUDA (kernels/cuda/nn_kernels.h).
//
// The token-embedding gradient is a scatter-add that must not depend on thread timing, so
// it never adds floats atomically. Instead: (1) count each token id's occurrences, (2) scan
// the counts into bucket offsets, (3) drop each position into its token's bucket (integer
// atomics pick the slot, so the order inside a bucket varies), (4) one block per token id
// sorts its bucket by position and sums the gradient rows in that order. Same inputs, same
// bits.
#include <algorithm>
#include <climits>

#include "kernels/cuda/column_sum.h"
#include "kernels/cuda/nn_kernels.h"
#include "kernels/cuda/vec.cuh"

namespace fsdp::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kScanThreads = 1024;
constexpr int kRowThreads = 128;  // one block per token id: 96 packs of a 768-wide bf16 row

template <int W, typename T, typename O>
__global__ void embedding_forward_kernel(O* out, const int32_t* idx, const T* wte, const T* wpe,
                                         int64_t tokens, int64_t seq, int64_t C) {
  const int64_t chunks = C / W;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < tokens * chunks;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t bt = i / chunks, c = (i % chunks) * W;
    float e[W], p[W] = {};
    load_floats<W>(wte + int64_t(idx[bt]) * C + c, e);
    if (wpe) load_floats<W>(wpe + (bt % seq) * C + c, p);
#pragma unroll
    for (int j = 0; j < W; ++j) e[j] += p[j];
    store_floats<W>(out + bt * C + c, e);
  }
}

__global__ void count_tokens_kernel(const int32_t* idx, int64_t tokens, int32_t* counts) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < tokens;
       i += int64_t(gridDim.x) * blockDim.x)
    atomicAdd(&counts[idx[i]], 1);
}

// offsets[v] = sum of counts[0..v) (and offsets[V] = total); cursor = offsets. One block:
// each thread scans a contiguous segment, then the segment totals are scanned.
__global__ void scan_counts_kernel(const int32_t* counts, int64_t V, int32_t* offsets,
                                   int32_t* cursor) {
  __shared__ int32_t totals[kScanThreads];
  const int64_t seg = (V + kScanThreads - 1) / kScanThreads;
  const int64_t v0 = threadIdx.x * seg, v1 = min(V, v0 + seg);
  int32_t local = 0;
  for (int64_t v = v0; v < v1; ++v) local += counts[v];
  totals[threadIdx.x] = local;
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t run = 0;
    for (int t = 0; t < kScanThreads; ++t) {
      const int32_t c = totals[t];
      totals[t] = run;
      run += c;
    }
    offsets[V] = run;
  }
  __syncthreads();
  int32_t run = totals[threadIdx.x];
  for (int64_t v = v0; v < v1; ++v) {
    offsets[v] = cursor[v] = run;
    run += counts[v];
  }
}

__global__ void fill_buckets_kernel(const int32_t* idx, int64_t tokens, int32_t* cursor,
                                    int32_t* buckets) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < tokens;
       i += int64_t(gridDim.x) * blockDim.x)
    buckets[atomicAdd(&cursor[idx[i]], 1)] = int32_t(i);
}

// Sorts keys[0, n) ascending in shared memory (bitonic network over the next power of two,
// padded with INT_MAX). All threads of the block call it.
__device__ void sort_in_shared(int32_t* keys, int32_t n) {
  int32_t size = 1;
  while (size < n) size <<= 1;
  for (int32_t i = n + threadIdx.x; i < size; i += blockDim.x) keys[i] = INT_MAX;
  __syncthreads();
  for (int32_t k = 2; k <= size; k <<= 1) {
    for (int32_t j = k >> 1; j > 0; j >>= 1) {
      for (int32_t i = threadIdx.x; i < size; i += blockDim.x) {
        const int32_t partner = i ^ j;
        if (partner > i) {
          const int32_t a = keys[i], b = keys[partner];
          if ((a > b) == ((i & k) == 0)) {
            keys[i] = b;
            keys[partner] = a;
          }
        }
      }
      __syncthreads();
    }
  }
}

constexpr int32_t kSharedSortCapacity = 4096;  // bucket entries sorted in shared memory

// One block per token id v: orders its bucket by position, then dwte[v] += the dout rows of
// those positions, in that order. Buckets up to kSharedSortCapacity are sorted in shared
// memory; a larger one ranks each entry by counting the smaller positions (O(n^2), rare).
template <int W, typename T, typename G>
__global__ void accumulate_rows_kernel(G* dwte, const T* dout, const int32_t* offsets,
                                       const int32_t* buckets, int32_t* sorted, int64_t C) {
  __shared__ int32_t keys[kSharedSortCapacity];
  const int64_t v = blockIdx.x;
  const int32_t begin = offsets[v], end = offsets[v + 1], n = end - begin;
  if (n == 0) return;
  const int32_t* order = keys;
  if (n <= kSharedSortCapacity) {
    for (int32_t e = threadIdx.x; e < n; e += blockDim.x) keys[e] = buckets[begin + e];
    __syncthreads();
    sort_in_shared(keys, n);
  } else {
    for (int32_t e = begin + threadIdx.x; e < end; e += blockDim.x) {
      const int32_t pos = buckets[e];
      int32_t rank = 0;
      for (int32_t o = begin; o < end; ++o) rank += buckets[o] < pos;
      sorted[begin + rank] = pos;
    }
    __syncthreads();
    order = sorted + begin;
  }
  for (int64_t c = int64_t(threadIdx.x) * W; c < C; c += int64_t(blockDim.x) * W) {
    float acc[W] = {};
    for (int32_t e = 0; e < n; ++e) {
      float g[W];
      load_floats<W>(dout + int64_t(order[e]) * C + c, g);
#pragma unroll
      for (int j = 0; j < W; ++j) acc[j] += g[j];
    }
#pragma unroll
    for (int j = 0; j < W; ++j) {
      G& d = dwte[v * C + c + j];
      d = from_float<G>(to_float(d) + acc[j]);
    }
  }
}

template <typename T>
__global__ void rope_kernel(T* x, int64_t batch, int64_t seq, int64_t heads, int64_t D,
                            HeadStrides s, double theta, float sign) {
  const int64_t half = D / 2, n = batch * seq * heads * half;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = i % half, h = (i / half) % heads, t = (i / (half * heads)) % seq,
                  b = i / (half * heads * seq);
    // The angle in double, reduced to [-pi, pi] before the f32 sine and cosine: t * freq
    // reaches thousands of radians at long positions.
    const double a = double(t) * rope_inv_freq(p, D, theta);
    const float ar = float(a - 6.283185307179586 * rint(a / 6.283185307179586));
    float sn, cs;
    sincosf(ar, &sn, &cs);
    sn *= sign;
    T* v = x + b * s.b + t * s.t + h * s.h;  // (D)
    const float x1 = to_float(v[p]), x2 = to_float(v[p + half]);
    v[p] = from_float<T>(x1 * cs - x2 * sn);
    v[p + half] = from_float<T>(x2 * cs + x1 * sn);
  }
}

// Workspace: counts (V), offsets (V + 1), cursor (V), buckets (N), sorted (N) as int32, then
// the position-embedding partial sums (f32).
struct EmbeddingScratch {
  int32_t *counts, *offsets, *cursor, *buckets, *sorted;
  float* partials;
};

size_t index_ints(const EmbeddingDims& d) { return size_t(3 * d.vocab + 1 + 2 * d.batch * d.seq); }

EmbeddingScratch carve(const EmbeddingDims& d, void* workspace) {
  EmbeddingScratch s;
  s.counts = static_cast<int32_t*>(workspace);
  s.offsets = s.counts + d.vocab;
  s.cursor = s.offsets + d.vocab + 1;
  s.buckets = s.cursor + d.vocab;
  s.sorted = s.buckets + d.batch * d.seq;
  const size_t ints = (index_ints(d) + 3) / 4 * 4;  // keep the floats 16-byte aligned
  s.partials = reinterpret_cast<float*>(static_cast<int32_t*>(workspace) + ints);
  return s;
}

}  // namespace

void embedding_forward(const EmbeddingDims& d, void* out, const int32_t* idx, const void* wte,
                       const void* wpe, stream_t stream) {
  const int64_t tokens = d.batch * d.seq;
  if (tokens == 0 || d.channels == 0) return;
  dispatch_compute(d.dtype, "embedding_forward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_residual<T>(d.out_dtype, "embedding_forward", [&](auto otag) {
      using O = decltype(otag);
      dispatch_width<T>(d.channels, {out, wte, wpe}, [&](auto w) {
        constexpr int W = decltype(w)::value;
        embedding_forward_kernel<W, T, O>
            <<<grid_for(tokens * d.channels / W, kThreads), kThreads, 0, stream>>>(
                static_cast<O*>(out), idx, static_cast<const T*>(wte),
                static_cast<const T*>(wpe), tokens, d.seq, d.channels);
        FSDP_CHECK_LAUNCH();
      });
    });
  });
}

size_t embedding_backward_workspace_bytes(const EmbeddingDims& d) {
  const size_t ints = (index_ints(d) + 3) / 4 * 4;
  const size_t floats = column_sum_workspace_bytes(d.batch, d.seq * d.channels) / sizeof(float);
  return ints * sizeof(int32_t) + floats * sizeof(float);
}

void embedding_backward(const EmbeddingDims& d, void* dwte, void* dwpe, const void* dout,
                        const int32_t* idx, void* workspace, stream_t stream) {
  const int64_t tokens = d.batch * d.seq;
  if (tokens == 0 || d.channels == 0) return;
  const EmbeddingScratch s = carve(d, workspace);
  if (dwte) {
    FSDP_CALL(cudaMemsetAsync(s.counts, 0, size_t(d.vocab) * sizeof(int32_t), stream));
    count_tokens_kernel<<<grid_for(tokens, kThreads), kThreads, 0, stream>>>(idx, tokens, s.counts);
    FSDP_CHECK_LAUNCH();
    scan_counts_kernel<<<1, kScanThreads, 0, stream>>>(s.counts, d.vocab, s.offsets, s.cursor);
    FSDP_CHECK_LAUNCH();
    fill_buckets_kernel<<<grid_for(tokens, kThreads), kThreads, 0, stream>>>(idx, tokens, s.cursor,
                                                                            s.buckets);
    FSDP_CHECK_LAUNCH();
    dispatch_compute(d.dtype, "embedding_backward", [&](auto ttag) {
      using T = decltype(ttag);
      dispatch_compute(d.grad_dtype, "embedding_backward gradient", [&](auto gtag) {
        using G = decltype(gtag);
        dispatch_width<T>(d.channels, {dout}, [&](auto w) {
          constexpr int W = decltype(w)::value;
          accumulate_rows_kernel<W, T, G><<<unsigned(d.vocab), kRowThreads, 0, stream>>>(
              static_cast<G*>(dwte), static_cast<const T*>(dout), s.offsets, s.buckets, s.sorted,
              d.channels);
          FSDP_CHECK_LAUNCH();
        });
      });
    });
  }
  if (dwpe) {  // dwpe[t] += sum over b of dout[b, t]: column sums of dout viewed as (B, T*C)
    const int64_t n = d.seq * d.channels;
    column_partials(dout, d.dtype, d.batch, n, s.partials, stream);
    finish_column_sums(s.partials, column_row_blocks(d.batch), n, dwpe, d.grad_dtype, true, stream);
  }
}

void rope_apply(void* x, DType dtype, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                const HeadStrides& strides, double theta, bool inverse, stream_t stream) {
  const int64_t n = batch * seq * heads * (head_dim / 2);
  if (n == 0) return;
  dispatch_compute(dtype, "rope_apply", [&](auto tag) {
    using T = decltype(tag);
    rope_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(x), batch, seq, heads, head_dim, strides, theta, inverse ? -1.f : 1.f);
    FSDP_CHECK_LAUNCH();
  });
}

}  // namespace fsdp::kernels::cuda
