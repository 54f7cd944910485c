// Fused softmax cross-entropy on CUDA : one block per row.
// Forward: a single pass with an online max / sum of exponentials per thread, merged across
// the block. Backward: one pass writing (softmax - onehot) * dloss, in place if asked.
// Forward-backward (the chunked classifier): the forward's online pass, then, in the same
// launch, the backward's write pass over the row in place.
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/vec.cuh"

namespace fsdp::kernels::cuda {
namespace {

constexpr int kThreads = 512;

// Running (max, sum of exp(x - max)) of a stream of logits.
struct OnlineSoftmax {
  float m = -INFINITY, s = 0.f;
  // Adds a pack of values (those at or past `valid` are padding): one rescale per pack.
  template <int W>
  __device__ void add_pack(const float (&v)[W], int valid) {
    float pm = -INFINITY;
#pragma unroll
    for (int j = 0; j < W; ++j)
      if (j < valid) pm = fmaxf(pm, v[j]);
    if (pm == -INFINITY) return;
    if (pm > m) {
      s *= __expf(m - pm);
      m = pm;
    }
#pragma unroll
    for (int j = 0; j < W; ++j)
      if (j < valid) s += __expf(v[j] - m);
  }
  __device__ void merge(float om, float os) {
    if (om == -INFINITY) return;
    const float nm = fmaxf(m, om);
    s = s * __expf(m - nm) + os * __expf(om - nm);
    m = nm;
  }
};

template <int W, typename T>
__global__ void cross_entropy_forward_kernel(float* losses, float* lse, const T* logits,
                                             const int32_t* targets, int64_t Vp, int64_t V) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * Vp;  // (Vp)
  OnlineSoftmax acc;
  for (int64_t c = int64_t(threadIdx.x) * W; c < V; c += int64_t(blockDim.x) * W) {
    float v[W];
    load_floats<W>(x + c, v);  // rows are Vp long: a pack never crosses into the next row
    acc.add_pack<W>(v, int(min(int64_t(W), V - c)));
  }
  // Merge across the warp, then across warps.
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, acc.m, o);
    const float os = __shfl_xor_sync(0xffffffffu, acc.s, o);
    acc.merge(om, os);
  }
  __shared__ float wm[kThreads / kWarp], ws[kThreads / kWarp];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) {
    wm[warp] = acc.m;
    ws[warp] = acc.s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    OnlineSoftmax total;
    for (int w = 0; w < int(blockDim.x / kWarp); ++w) total.merge(wm[w], ws[w]);
    const float log_sum = total.m + logf(total.s);
    lse[row] = log_sum;
    const int32_t t = targets[row];
    losses[row] = t < 0 ? 0.f : log_sum - to_float(x[t]);
  }
}

// `live`: the columns that hold classes; `begin`: the class of column 0 (a vocabulary-
// parallel shard; 0 for a whole row).
template <int W, typename T>
__global__ void cross_entropy_backward_kernel(T* dlogits, const T* logits, const float* lse,
                                              const int32_t* targets, int64_t Vp, int64_t live,
                                              int64_t begin, float dloss) {
  const int64_t row = blockIdx.x;
  const int32_t t = targets[row];
  const int64_t target_col = int64_t(t) - begin;
  const float log_sum = lse[row];
  const T* x = logits + row * Vp;
  T* dx = dlogits + row * Vp;  // may be x itself: each element is read before it is written
  for (int64_t c = int64_t(threadIdx.x) * W; c < Vp; c += int64_t(blockDim.x) * W) {
    float v[W], d[W];
    load_floats<W>(x + c, v);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const int64_t col = c + j;
      const bool on = t >= 0 && col < live;
      d[j] = on ? (__expf(v[j] - log_sum) - (col == target_col ? 1.f : 0.f)) * dloss : 0.f;
    }
    store_floats<W>(dx + c, d);
  }
}

// The block-wide merge of every thread's running (max, sum), valid in every thread on
// return. `wm` and `ws` are the block's shared scratch (one per warp).
__device__ OnlineSoftmax block_softmax_stats(OnlineSoftmax acc, float* wm, float* ws) {
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, acc.m, o);
    const float os = __shfl_xor_sync(0xffffffffu, acc.s, o);
    acc.merge(om, os);
  }
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) {
    wm[warp] = acc.m;
    ws[warp] = acc.s;
  }
  __syncthreads();
  // Every thread merges the few per-warp partials itself: no second barrier and broadcast.
  OnlineSoftmax total;
  for (int w = 0; w < int(blockDim.x / kWarp); ++w) total.merge(wm[w], ws[w]);
  return total;
}

// The row's log-sum-exp from every thread's running (max, sum).
__device__ float block_log_sum_exp(OnlineSoftmax acc, float* wm, float* ws) {
  const OnlineSoftmax total = block_softmax_stats(acc, wm, ws);
  return total.m + logf(total.s);
}

// One block per row: the row's loss, then (with write_grad) the row overwritten with
// (softmax - onehot) * dloss. The target's logit is read before the barrier inside
// block_log_sum_exp, and every write comes after it, so reading the row and replacing it in
// place cannot race.
template <int W, typename T>
__global__ void cross_entropy_forward_backward_kernel(float* losses, T* logits,
                                                      const int32_t* targets, int64_t Vp,
                                                      int64_t V, float dloss, bool write_grad) {
  const int64_t row = blockIdx.x;
  T* x = logits + row * Vp;  // (Vp)
  const int32_t t = targets[row];
  const float target_logit = (threadIdx.x == 0 && t >= 0) ? to_float(x[t]) : 0.f;
  OnlineSoftmax acc;
  for (int64_t c = int64_t(threadIdx.x) * W; c < V; c += int64_t(blockDim.x) * W) {
    float v[W];
    load_floats<W>(x + c, v);
    acc.add_pack<W>(v, int(min(int64_t(W), V - c)));
  }
  __shared__ float wm[kThreads / kWarp], ws[kThreads / kWarp];
  const float log_sum = block_log_sum_exp(acc, wm, ws);
  if (threadIdx.x == 0) losses[row] = t < 0 ? 0.f : log_sum - target_logit;
  if (!write_grad) return;
  for (int64_t c = int64_t(threadIdx.x) * W; c < Vp; c += int64_t(blockDim.x) * W) {
    float v[W], d[W];
    load_floats<W>(x + c, v);  // this thread's own pack: read, then overwritten
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const int64_t col = c + j;
      const bool live = t >= 0 && col < V;
      d[j] = live ? (__expf(v[j] - log_sum) - (col == t ? 1.f : 0.f)) * dloss : 0.f;
    }
    store_floats<W>(x + c, d);
  }
}

// One block per row of a vocabulary-parallel shard: partials (3, rows) = the shard's
// (max, sum of exp(x - max)) over its `live` class columns and the target's logit when
// column t - begin is one of them (else 0).
template <int W, typename T>
__global__ void cross_entropy_shard_stats_kernel(float* partials, const T* logits,
                                                 const int32_t* targets, int64_t rows,
                                                 int64_t Vp, int64_t live, int64_t begin) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * Vp;  // (Vp)
  OnlineSoftmax acc;
  for (int64_t c = int64_t(threadIdx.x) * W; c < live; c += int64_t(blockDim.x) * W) {
    float v[W];
    load_floats<W>(x + c, v);
    acc.add_pack<W>(v, int(min(int64_t(W), live - c)));
  }
  __shared__ float wm[kThreads / kWarp], ws[kThreads / kWarp];
  const OnlineSoftmax total = block_softmax_stats(acc, wm, ws);
  if (threadIdx.x == 0) {
    const int64_t t = targets[row], col = t - begin;
    partials[row] = total.m;
    partials[rows + row] = total.s;
    partials[2 * rows + row] = (t >= 0 && col >= 0 && col < live) ? to_float(x[col]) : 0.f;
  }
}

// One thread per row: every shard's partials (shards, 3, rows) merged in shard order.
__global__ void cross_entropy_merge_shards_kernel(float* losses, float* lse,
                                                  const float* partials,
                                                  const int32_t* targets, int64_t rows,
                                                  int64_t shards) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  OnlineSoftmax total;
  float target_logit = 0.f;
  for (int64_t s = 0; s < shards; ++s) {
    const float* p = partials + s * 3 * rows;
    total.merge(p[row], p[rows + row]);
    target_logit += p[2 * rows + row];
  }
  const float log_sum = total.m + logf(total.s);
  lse[row] = log_sum;
  losses[row] = targets[row] < 0 ? 0.f : log_sum - target_logit;
}

}  // namespace

void cross_entropy_forward(const CrossEntropyDims& d, float* losses, float* lse,
                           const void* logits, const int32_t* targets, stream_t stream) {
  if (d.rows == 0) return;
  dispatch_compute(d.dtype, "cross_entropy_forward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_width<T>(d.padded_vocab, {logits}, [&](auto w) {
      constexpr int W = decltype(w)::value;
      cross_entropy_forward_kernel<W, T><<<unsigned(d.rows), kThreads, 0, stream>>>(
          losses, lse, static_cast<const T*>(logits), targets, d.padded_vocab, d.vocab);
      FSDP_CHECK_LAUNCH();
    });
  });
}

void cross_entropy_backward(const CrossEntropyDims& d, void* dlogits, const void* logits,
                            const float* lse, const int32_t* targets, double dloss,
                            stream_t stream) {
  if (d.rows == 0) return;
  dispatch_compute(d.dtype, "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_width<T>(d.padded_vocab, {dlogits, logits}, [&](auto w) {
      constexpr int W = decltype(w)::value;
      cross_entropy_backward_kernel<W, T><<<unsigned(d.rows), kThreads, 0, stream>>>(
          static_cast<T*>(dlogits), static_cast<const T*>(logits), lse, targets, d.padded_vocab,
          d.live_columns(), d.vocab_begin, float(dloss));
      FSDP_CHECK_LAUNCH();
    });
  });
}

void cross_entropy_forward_backward(const CrossEntropyDims& d, float* losses, void* logits,
                                    const int32_t* targets, double dloss, bool write_grad,
                                    stream_t stream) {
  if (d.rows == 0) return;
  dispatch_compute(d.dtype, "cross_entropy_forward_backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_width<T>(d.padded_vocab, {logits}, [&](auto w) {
      constexpr int W = decltype(w)::value;
      cross_entropy_forward_backward_kernel<W, T><<<unsigned(d.rows), kThreads, 0, stream>>>(
          losses, static_cast<T*>(logits), targets, d.padded_vocab, d.vocab, float(dloss),
          write_grad);
      FSDP_CHECK_LAUNCH();
    });
  });
}

void cross_entropy_shard_stats(const CrossEntropyDims& d, float* partials, const void* logits,
                               const int32_t* targets, stream_t stream) {
  if (d.rows == 0) return;
  dispatch_compute(d.dtype, "cross_entropy_shard_stats", [&](auto tag) {
    using T = decltype(tag);
    dispatch_width<T>(d.padded_vocab, {logits}, [&](auto w) {
      constexpr int W = decltype(w)::value;
      cross_entropy_shard_stats_kernel<W, T><<<unsigned(d.rows), kThreads, 0, stream>>>(
          partials, static_cast<const T*>(logits), targets, d.rows, d.padded_vocab,
          d.live_columns(), d.vocab_begin);
      FSDP_CHECK_LAUNCH();
    });
  });
}

void cross_entropy_merge_shards(int64_t rows, int64_t shards, float* losses, float* lse,
                                const float* partials, const int32_t* targets, stream_t stream) {
  if (rows == 0) return;
  constexpr int kMergeThreads = 256;
  cross_entropy_merge_shards_kernel<<<grid_for(rows, kMergeThreads), kMergeThreads, 0, stream>>>(
      losses, lse, partials, targets, rows, shards);
  FSDP_CHECK_LAUNCH();
}

}  // namespace fsdp::kernels::cuda
