// Fused softmax cross-entropy on CUDA (kernels/cuda/nn_kernels.h): one block per row.
// Forward: a single pass with an online max / sum of exponentials per thread, merged across
// the block. Backward: one pass writing (softmax - onehot) * dloss, in place if asked.
// Forward and backward together (training, when nothing else reads the logits): the row is
// read once into shared memory, and the gradient written over it from there.
#include "kernels/cuda/nn_kernels.h"
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

// The log-sum-exp of a row from every thread's running pair (all threads call it; the
// result is returned to all of them).
__device__ float block_log_sum_exp(OnlineSoftmax acc) {
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, acc.m, o);
    const float os = __shfl_xor_sync(0xffffffffu, acc.s, o);
    acc.merge(om, os);
  }
  __shared__ float wm[kThreads / kWarp], ws[kThreads / kWarp], result;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) {
    wm[warp] = acc.m;
    ws[warp] = acc.s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    OnlineSoftmax total;
    for (int w = 0; w < int(blockDim.x / kWarp); ++w) total.merge(wm[w], ws[w]);
    result = total.m + logf(total.s);
  }
  __syncthreads();
  return result;
}

// Forward and backward of one row: loss and lse as the forward kernel, then
// dlogits = (softmax - onehot) * dloss written over the logits. kShared: the row is staged in
// shared memory (read from global memory once); else it is read twice.
template <int W, typename T, bool kShared>
__global__ void cross_entropy_fused_kernel(float* losses, float* lse, T* logits,
                                           const int32_t* targets, int64_t Vp, int64_t V,
                                           float dloss) {
  extern __shared__ __align__(16) unsigned char staged_bytes[];
  T* staged = reinterpret_cast<T*>(staged_bytes);
  const int64_t row = blockIdx.x;
  T* x = logits + row * Vp;  // (Vp)
  const int32_t t = targets[row];
  // The target's logit, read before any thread starts writing gradients over the row.
  const float target_logit = threadIdx.x == 0 && t >= 0 ? to_float(x[t]) : 0.f;
  OnlineSoftmax acc;
  for (int64_t c = int64_t(threadIdx.x) * W; c < Vp; c += int64_t(blockDim.x) * W) {
    if (kShared) store_pack_of<W>(staged + c, x + c);
    if (c >= V) continue;
    float v[W];
    load_floats<W>((kShared ? staged : x) + c, v);
    acc.add_pack<W>(v, int(min(int64_t(W), V - c)));
  }
  const float log_sum = block_log_sum_exp(acc);
  if (threadIdx.x == 0) {
    lse[row] = log_sum;
    losses[row] = t < 0 ? 0.f : log_sum - target_logit;
  }
  // Every thread reads back only the packs it staged itself: no barrier needed before.
  for (int64_t c = int64_t(threadIdx.x) * W; c < Vp; c += int64_t(blockDim.x) * W) {
    float v[W], d[W];
    load_floats<W>((kShared ? staged : x) + c, v);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const int64_t col = c + j;
      const bool live = t >= 0 && col < V;
      d[j] = live ? (__expf(v[j] - log_sum) - (col == t ? 1.f : 0.f)) * dloss : 0.f;
    }
    store_floats<W>(x + c, d);
  }
}

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
  const float log_sum = block_log_sum_exp(acc);
  if (threadIdx.x == 0) {
    lse[row] = log_sum;
    const int32_t t = targets[row];
    losses[row] = t < 0 ? 0.f : log_sum - to_float(x[t]);
  }
}

template <int W, typename T>
__global__ void cross_entropy_backward_kernel(T* dlogits, const T* logits, const float* lse,
                                              const int32_t* targets, int64_t Vp, int64_t V,
                                              float dloss) {
  const int64_t row = blockIdx.x;
  const int32_t t = targets[row];
  const float log_sum = lse[row];
  const T* x = logits + row * Vp;
  T* dx = dlogits + row * Vp;  // may be x itself: each element is read before it is written
  for (int64_t c = int64_t(threadIdx.x) * W; c < Vp; c += int64_t(blockDim.x) * W) {
    float v[W], d[W];
    load_floats<W>(x + c, v);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const int64_t col = c + j;
      const bool live = t >= 0 && col < V;
      d[j] = live ? (__expf(v[j] - log_sum) - (col == t ? 1.f : 0.f)) * dloss : 0.f;
    }
    store_floats<W>(dx + c, d);
  }
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

void cross_entropy_fused(const CrossEntropyDims& d, float* losses, float* lse, void* logits,
                         const int32_t* targets, double dloss, stream_t stream) {
  if (d.rows == 0) return;
  dispatch_compute(d.dtype, "cross_entropy_fused", [&](auto tag) {
    using T = decltype(tag);
    dispatch_width<T>(d.padded_vocab, {logits}, [&](auto w) {
      constexpr int W = decltype(w)::value;
      int device = 0, limit = 0;
      FSDP_CALL(cudaGetDevice(&device));
      FSDP_CALL(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
      const size_t row_bytes = size_t(d.padded_vocab) * sizeof(T);
      // Leave room for block_log_sum_exp's static shared memory.
      if (row_bytes + 1024 <= size_t(limit)) {
        auto kernel = cross_entropy_fused_kernel<W, T, true>;
        FSDP_CALL(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(row_bytes)));
        kernel<<<unsigned(d.rows), kThreads, row_bytes, stream>>>(
            losses, lse, static_cast<T*>(logits), targets, d.padded_vocab, d.vocab, float(dloss));
      } else {
        cross_entropy_fused_kernel<W, T, false><<<unsigned(d.rows), kThreads, 0, stream>>>(
            losses, lse, static_cast<T*>(logits), targets, d.padded_vocab, d.vocab, float(dloss));
      }
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
          d.vocab, float(dloss));
      FSDP_CHECK_LAUNCH();
    });
  });
}

}  // namespace fsdp::kernels::cuda
