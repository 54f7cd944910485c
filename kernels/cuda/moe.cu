// Mixture-of-experts kernels on CUDA.
//
// Routing: one warp per token. The scores are computed in double (the CPU reference's
// precision) into shared memory and stored as f32; the top-k choice compares f32 keys with
// a total order (kernels/scalar_math.h), so the device picks the experts the CPU picks.
// k rounds, each a warp-wide arg-max over the experts not taken yet.
//
// Grouping: the (token, slot) pairs are sorted by expert with CUB's stable radix sort over
// their flat index p = n k + j, which keeps (token, slot) order within each expert.
//
// Gathers: every output element is written by one thread summing its few inputs in slot
// order, and the combine's weight gradients are warp sums in a fixed order: no atomics on
// floats anywhere, so results never depend on timing.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/moe.h"
#include "kernels/cuda/vec.cuh"
#include "kernels/scalar_math.h"

namespace fsdp::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kFull = 0xffffffffu;
// The router's shared memory per block: a double score and a taken flag per expert and warp.
constexpr int64_t kRouterSharedBytes = 48 * 1024;
constexpr int64_t kRouterBytesPerExpert = sizeof(double) + sizeof(bool);

__device__ __forceinline__ double warp_max_double(double v) {
  for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

__device__ __forceinline__ double warp_sum_double(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// Warps (tokens) per router block: as many as fit the shared memory, at most 8.
int router_warps(int64_t experts) {
  const int64_t w = kRouterSharedBytes / (kRouterBytesPerExpert * experts);
  return int(w < 1 ? 1 : (w > 8 ? 8 : w));
}

template <typename T>
__global__ void router_forward_kernel(int32_t* indices, float* weights, float* scores,
                                      const T* logits, const float* bias, int64_t N, int E,
                                      int k, bool sigmoid_score, bool normalize) {
  extern __shared__ double shared[];
  const int warps = blockDim.x / kWarp, warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t n = int64_t(blockIdx.x) * warps + warp;
  if (n >= N) return;  // the whole warp: no block-wide barrier follows
  double* s = shared + int64_t(warp) * E;                                             // (E)
  bool* taken = reinterpret_cast<bool*>(shared + int64_t(warps) * E) + int64_t(warp) * E;  // (E)
  const T* l = logits + n * E;
  if (sigmoid_score) {
    for (int e = lane; e < E; e += kWarp) s[e] = sigmoid(double(to_float(l[e])));
  } else {
    double m = -INFINITY;
    for (int e = lane; e < E; e += kWarp) {
      s[e] = double(to_float(l[e]));
      m = fmax(m, s[e]);
    }
    m = warp_max_double(m);
    double sum = 0;
    for (int e = lane; e < E; e += kWarp) {
      s[e] = exp(s[e] - m);
      sum += s[e];
    }
    sum = warp_sum_double(sum);
    for (int e = lane; e < E; e += kWarp) s[e] /= sum;
  }
  for (int e = lane; e < E; e += kWarp) {
    scores[n * E + e] = float(s[e]);
    taken[e] = false;
  }
  __syncwarp();
  double chosen_sum = 0;
  for (int j = 0; j < k; ++j) {
    // Each lane's best untaken expert, then the best of the lanes (E: none yet).
    float best_key = -INFINITY;
    int best = E;
    for (int e = lane; e < E; e += kWarp) {
      if (taken[e]) continue;
      const float key = router_key(float(s[e]), bias ? bias[e] : 0.f);
      if (router_before(key, int64_t(e), best_key, int64_t(best))) {
        best_key = key;
        best = e;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float other_key = __shfl_xor_sync(kFull, best_key, o);
      const int other = __shfl_xor_sync(kFull, best, o);
      if (router_before(other_key, int64_t(other), best_key, int64_t(best))) {
        best_key = other_key;
        best = other;
      }
    }
    chosen_sum += s[best];  // the same order of additions as the CPU's
    if (lane == 0) {
      taken[best] = true;
      indices[n * k + j] = best;
    }
    __syncwarp();
  }
  if (lane == 0) {
    const double z = normalize ? chosen_sum + kRouterNormEps : 1.0;
    for (int j = 0; j < k; ++j) weights[n * k + j] = float(s[indices[n * k + j]] / z);
  }
}

// d score_e: the direct gradient plus the chosen slot's (see kernels/cpu/moe.cc).
__device__ __forceinline__ double score_grad(int e, double direct, const float* dw,
                                             const int32_t* chosen, int k, bool normalize,
                                             double weighted, double z) {
  double g = direct;
  for (int j = 0; j < k; ++j)
    if (chosen[j] == e) g += normalize ? (double(dw[j]) - weighted) / z : double(dw[j]);
  return g;
}

template <typename T>
__global__ void router_backward_kernel(T* dlogits, const float* dweights, const float* dscores,
                                       const float* scores, const int32_t* indices, int64_t N,
                                       int E, int k, bool sigmoid_score, bool normalize) {
  const int warps = blockDim.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t n = int64_t(blockIdx.x) * warps + threadIdx.x / kWarp;
  if (n >= N) return;
  const float* s = scores + n * E;  // (E)
  const float* dw = dweights + n * k;
  const int32_t* chosen = indices + n * k;
  const float* direct = dscores ? dscores + n * E : nullptr;
  double z = 0, weighted = 0;
  for (int j = 0; j < k; ++j) z += double(s[chosen[j]]);
  z += kRouterNormEps;
  for (int j = 0; j < k; ++j) weighted += double(dw[j]) * double(s[chosen[j]]) / z;
  T* out = dlogits + n * E;
  if (sigmoid_score) {
    for (int e = lane; e < E; e += kWarp) {
      const double se = double(s[e]);
      const double g = score_grad(e, direct ? double(direct[e]) : 0.0, dw, chosen, k, normalize,
                                  weighted, z);
      out[e] = from_float<T>(float(g * se * (1.0 - se)));
    }
    return;
  }
  double dot = 0;
  for (int e = lane; e < E; e += kWarp)
    dot += score_grad(e, direct ? double(direct[e]) : 0.0, dw, chosen, k, normalize, weighted, z) *
           double(s[e]);
  dot = warp_sum_double(dot);
  for (int e = lane; e < E; e += kWarp) {
    const double g =
        score_grad(e, direct ? double(direct[e]) : 0.0, dw, chosen, k, normalize, weighted, z);
    out[e] = from_float<T>(float(double(s[e]) * (g - dot)));
  }
}

__global__ void count_experts_kernel(int32_t* counts, const int32_t* indices, int64_t pairs) {
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs;
       p += int64_t(gridDim.x) * blockDim.x)
    atomicAdd(&counts[indices[p]], 1);  // integers: the same counts in any order
}

__global__ void iota_kernel(int32_t* out, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = int32_t(i);
}

// sorted (P): the pairs in row order -> source (P) and its inverse dest (P).
__global__ void row_maps_kernel(int32_t* source, int32_t* dest, const int32_t* sorted,
                                int64_t pairs, int k) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < pairs;
       r += int64_t(gridDim.x) * blockDim.x) {
    const int32_t p = sorted[r];
    source[r] = p / k;
    dest[p] = int32_t(r);
  }
}

template <int W, typename T>
__global__ void permute_kernel(T* x_sorted, const T* x, const int32_t* source, int64_t rows,
                               int64_t C) {
  const int64_t chunks = C / W;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * chunks;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / chunks, c = (i % chunks) * W;
    float v[W];
    load_floats<W>(x + int64_t(source[r]) * C + c, v);
    store_floats<W>(x_sorted + r * C + c, v);
  }
}

// dx[n] (+)= the sum over slots, in slot order, of dx_sorted[dest[n, j]].
template <int W, typename T>
__global__ void permute_backward_kernel(T* dx, const T* dx_sorted, const int32_t* dest,
                                        int64_t N, int k, int64_t C, bool accumulate) {
  const int64_t chunks = C / W;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N * chunks;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / chunks, c = (i % chunks) * W;
    float acc[W] = {};
    for (int j = 0; j < k; ++j) {
      float g[W];
      load_floats<W>(dx_sorted + int64_t(dest[n * k + j]) * C + c, g);
#pragma unroll
      for (int q = 0; q < W; ++q) acc[q] += g[q];
    }
    if (accumulate) {
      float old[W];
      load_floats<W>(dx + n * C + c, old);
#pragma unroll
      for (int q = 0; q < W; ++q) acc[q] = old[q] + acc[q];
    }
    store_floats<W>(dx + n * C + c, acc);
  }
}

template <int W, typename T>
__global__ void unpermute_kernel(T* out, const T* y_sorted, const float* weights,
                                 const int32_t* dest, int64_t N, int k, int64_t C) {
  const int64_t chunks = C / W;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N * chunks;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / chunks, c = (i % chunks) * W;
    float acc[W] = {};
    for (int j = 0; j < k; ++j) {
      const float w = weights[n * k + j];
      float y[W];
      load_floats<W>(y_sorted + int64_t(dest[n * k + j]) * C + c, y);
#pragma unroll
      for (int q = 0; q < W; ++q) acc[q] += w * y[q];
    }
    store_floats<W>(out + n * C + c, acc);
  }
}

// One warp per token: each slot's gradient row w * dout[n], and its weight's gradient, the
// dot product of dout[n] with the expert's output row, summed across the warp.
template <int W, typename T>
__global__ void unpermute_backward_kernel(T* dy_sorted, float* dweights, const T* dout,
                                          const T* y_sorted, const float* weights,
                                          const int32_t* dest, int64_t N, int k, int64_t C) {
  const int warps = blockDim.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t n = int64_t(blockIdx.x) * warps + threadIdx.x / kWarp;
  if (n >= N) return;
  const T* g = dout + n * C;  // (C)
  for (int j = 0; j < k; ++j) {
    const int64_t r = dest[n * k + j];
    const float w = weights[n * k + j];
    float dot = 0;
    for (int64_t c = int64_t(lane) * W; c < C; c += int64_t(kWarp) * W) {
      float gv[W], yv[W], dy[W];
      load_floats<W>(g + c, gv);
      load_floats<W>(y_sorted + r * C + c, yv);
#pragma unroll
      for (int q = 0; q < W; ++q) {
        dot += gv[q] * yv[q];
        dy[q] = w * gv[q];
      }
      store_floats<W>(dy_sorted + r * C + c, dy);
    }
    dot = warp_sum(dot);
    if (lane == 0) dweights[n * k + j] = dot;
  }
}

// The radix sort looks at the bits of expert ids below 2^bits >= experts only.
int expert_bits(int64_t experts) {
  int bits = 1;
  while (bits < 31 && (int64_t(1) << bits) < experts) ++bits;
  return bits;
}

size_t sort_temp_bytes(int64_t pairs, int64_t experts) {
  size_t bytes = 0;
  FSDP_CALL(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), pairs, 0,
      expert_bits(experts)));
  return bytes;
}

// Three int32 arrays of `pairs` (sorted keys, pair ids, sorted pair ids), then CUB's scratch
// at a 256-byte boundary.
size_t sort_ints(int64_t pairs) { return size_t(3 * pairs); }

}  // namespace

void moe_router_forward(const RouterDims& d, int32_t* indices, float* weights, float* scores,
                        const void* logits, const float* bias, stream_t stream) {
  if (d.tokens == 0) return;
  FSDP_CHECK(d.experts > 0 && d.experts <= kMaxRouterExperts, ValueError,
             "moe_router_forward: the CUDA router takes 1 to ", kMaxRouterExperts,
             " experts, got ", d.experts);
  const int warps = router_warps(d.experts);
  const size_t shared = size_t(warps * d.experts * kRouterBytesPerExpert);
  const unsigned blocks = unsigned((d.tokens + warps - 1) / warps);
  dispatch_compute(d.dtype, "moe_router_forward", [&](auto tag) {
    using T = decltype(tag);
    router_forward_kernel<T><<<blocks, warps * kWarp, shared, stream>>>(
        indices, weights, scores, static_cast<const T*>(logits), bias, d.tokens, int(d.experts),
        int(d.top_k), d.score == RouterScore::Sigmoid, d.normalize);
    FSDP_CHECK_LAUNCH();
  });
}

void moe_router_backward(const RouterDims& d, void* dlogits, const float* dweights,
                         const float* dscores, const float* scores, const int32_t* indices,
                         stream_t stream) {
  if (d.tokens == 0 || d.experts == 0) return;
  const int warps = kThreads / kWarp;
  const unsigned blocks = unsigned((d.tokens + warps - 1) / warps);
  dispatch_compute(d.dtype, "moe_router_backward", [&](auto tag) {
    using T = decltype(tag);
    router_backward_kernel<T><<<blocks, kThreads, 0, stream>>>(
        static_cast<T*>(dlogits), dweights, dscores, scores, indices, d.tokens, int(d.experts),
        int(d.top_k), d.score == RouterScore::Sigmoid, d.normalize);
    FSDP_CHECK_LAUNCH();
  });
}

size_t moe_sort_workspace_bytes(int64_t tokens, int64_t top_k, int64_t experts) {
  const int64_t pairs = tokens * top_k;
  return sort_ints(pairs) * sizeof(int32_t) + 256 + sort_temp_bytes(pairs, experts);
}

void moe_sort_by_expert(int64_t tokens, int64_t top_k, int64_t experts, int32_t* counts,
                        int32_t* source, int32_t* dest, const int32_t* indices, void* workspace,
                        stream_t stream) {
  const int64_t pairs = tokens * top_k;
  FSDP_CALL(cudaMemsetAsync(counts, 0, size_t(experts) * sizeof(int32_t), stream));
  if (pairs == 0) return;
  int32_t* sorted_keys = static_cast<int32_t*>(workspace);  // (P)
  int32_t* pair_ids = sorted_keys + pairs;                  // (P)
  int32_t* sorted_pairs = pair_ids + pairs;                 // (P)
  const uintptr_t after = reinterpret_cast<uintptr_t>(sorted_pairs + pairs);
  void* temp = reinterpret_cast<void*>((after + 255) / 256 * 256);
  size_t temp_bytes = sort_temp_bytes(pairs, experts);

  count_experts_kernel<<<grid_for(pairs, kThreads), kThreads, 0, stream>>>(counts, indices, pairs);
  FSDP_CHECK_LAUNCH();
  iota_kernel<<<grid_for(pairs, kThreads), kThreads, 0, stream>>>(pair_ids, pairs);
  FSDP_CHECK_LAUNCH();
  // Stable: pairs of one expert keep increasing p = n k + j.
  FSDP_CALL(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, indices, sorted_keys, pair_ids,
                                            sorted_pairs, pairs, 0, expert_bits(experts),
                                            stream));
  row_maps_kernel<<<grid_for(pairs, kThreads), kThreads, 0, stream>>>(source, dest, sorted_pairs,
                                                                      pairs, int(top_k));
  FSDP_CHECK_LAUNCH();
}

void moe_permute(const MoeRowsDims& d, void* x_sorted, const void* x, const int32_t* source,
                 stream_t stream) {
  if (d.rows() == 0 || d.channels == 0) return;
  dispatch_compute(d.dtype, "moe_permute", [&](auto tag) {
    using T = decltype(tag);
    dispatch_width<T>(d.channels, {x_sorted, x}, [&](auto w) {
      constexpr int W = decltype(w)::value;
      permute_kernel<W, T><<<grid_for(d.rows() * d.channels / W, kThreads), kThreads, 0, stream>>>(
          static_cast<T*>(x_sorted), static_cast<const T*>(x), source, d.rows(), d.channels);
      FSDP_CHECK_LAUNCH();
    });
  });
}

void moe_permute_backward(const MoeRowsDims& d, void* dx, const void* dx_sorted,
                          const int32_t* dest, bool accumulate_dx, stream_t stream) {
  if (d.tokens == 0 || d.channels == 0) return;
  dispatch_compute(d.dtype, "moe_permute_backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_width<T>(d.channels, {dx, dx_sorted}, [&](auto w) {
      constexpr int W = decltype(w)::value;
      permute_backward_kernel<W, T>
          <<<grid_for(d.tokens * d.channels / W, kThreads), kThreads, 0, stream>>>(
              static_cast<T*>(dx), static_cast<const T*>(dx_sorted), dest, d.tokens,
              int(d.top_k), d.channels, accumulate_dx);
      FSDP_CHECK_LAUNCH();
    });
  });
}

void moe_unpermute(const MoeRowsDims& d, void* out, const void* y_sorted, const float* weights,
                   const int32_t* dest, stream_t stream) {
  if (d.tokens == 0 || d.channels == 0) return;
  dispatch_compute(d.dtype, "moe_unpermute", [&](auto tag) {
    using T = decltype(tag);
    dispatch_width<T>(d.channels, {out, y_sorted}, [&](auto w) {
      constexpr int W = decltype(w)::value;
      const unsigned blocks = grid_for(d.tokens * d.channels / W, kThreads);
      unpermute_kernel<W, T><<<blocks, kThreads, 0, stream>>>(
          static_cast<T*>(out), static_cast<const T*>(y_sorted), weights, dest, d.tokens,
          int(d.top_k), d.channels);
      FSDP_CHECK_LAUNCH();
    });
  });
}

void moe_unpermute_backward(const MoeRowsDims& d, void* dy_sorted, float* dweights,
                            const void* dout, const void* y_sorted, const float* weights,
                            const int32_t* dest, stream_t stream) {
  if (d.tokens == 0 || d.top_k == 0) return;
  const int warps = kThreads / kWarp;
  const unsigned blocks = unsigned((d.tokens + warps - 1) / warps);
  dispatch_compute(d.dtype, "moe_unpermute_backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_width<T>(d.channels, {dy_sorted, dout, y_sorted}, [&](auto w) {
      constexpr int W = decltype(w)::value;
      unpermute_backward_kernel<W, T><<<blocks, kThreads, 0, stream>>>(
          static_cast<T*>(dy_sorted), dweights, static_cast<const T*>(dout),
          static_cast<const T*>(y_sorted), weights, dest, d.tokens, int(d.top_k), d.channels);
      FSDP_CHECK_LAUNCH();
    });
  });
}

// ---------------------------------------------------------------- auxiliary losses

namespace {

// counts (groups, E): the choices of each run of `per_group` pairs, by expert.
__global__ void count_group_experts_kernel(int32_t* counts, const int32_t* indices, int64_t pairs,
                                           int64_t per_group, int E) {
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs;
       p += int64_t(gridDim.x) * blockDim.x)
    atomicAdd(&counts[(p / per_group) * E + indices[p]], 1);  // integers: any order
}

// n: each run's tokens here; whole: the run's tokens on every rank holding a part of it.
__global__ void balancing_loss_kernel(float* per_token, float* dscores, const float* scores,
                                      const int32_t* counts, int64_t N, int E, int64_t n,
                                      int64_t whole, int k, double weight, double coeff,
                                      bool sigmoid_score) {
  const int warps = blockDim.x / kWarp, warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t t = int64_t(blockIdx.x) * warps + warp;
  if (t >= N) return;
  const int32_t* c = counts + (t / n) * E;  // (E) the run's choices
  const float* s = scores + t * E;          // (E)
  // c_e = E count_e / (n n k): the balancing loss's gradient by each score, unnormalized.
  const double scale = double(E) / (double(whole) * double(whole) * double(k));
  double sum = 1.0;
  if (sigmoid_score) {
    double a = 0;
    for (int e = lane; e < E; e += kWarp) a += double(s[e]);
    sum = warp_sum_double(a) + 1e-20;
  }
  double dot = 0;
  for (int e = lane; e < E; e += kWarp) dot += double(c[e]) * scale * double(s[e]) / sum;
  dot = warp_sum_double(dot);
  if (lane == 0) per_token[t] = float(weight * dot);
  for (int e = lane; e < E; e += kWarp)
    dscores[t * E + e] =
        float(coeff * weight * (double(c[e]) * scale / sum - (sigmoid_score ? dot / sum : 0.0)));
}

template <typename T>
__global__ void z_loss_kernel(float* per_token, T* dlogits, const T* logits, int64_t N, int E,
                              double coeff) {
  const int warps = blockDim.x / kWarp, warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t t = int64_t(blockIdx.x) * warps + warp;
  if (t >= N) return;
  const T* l = logits + t * E;  // (E)
  double m = -INFINITY;
  for (int e = lane; e < E; e += kWarp) m = fmax(m, double(to_float(l[e])));
  m = warp_max_double(m);
  double s = 0;
  for (int e = lane; e < E; e += kWarp) s += exp(double(to_float(l[e])) - m);
  s = warp_sum_double(s);
  const double lse = m + log(s);
  if (lane == 0) per_token[t] = float(lse * lse / double(N));
  for (int e = lane; e < E; e += kWarp)
    dlogits[t * E + e] =
        from_float<T>(float(coeff * 2.0 * lse * exp(double(to_float(l[e])) - m) / s / double(N)));
}

}  // namespace

void moe_group_expert_counts(const MoeLossDims& d, int32_t* counts, const int32_t* indices,
                             stream_t stream) {
  if (d.groups * d.experts == 0) return;
  FSDP_CALL(cudaMemsetAsync(counts, 0, size_t(d.groups * d.experts) * sizeof(int32_t), stream));
  const int64_t pairs = d.tokens * d.top_k;
  if (pairs == 0) return;
  count_group_experts_kernel<<<grid_for(pairs, kThreads), kThreads, 0, stream>>>(
      counts, indices, pairs, pairs / d.groups, int(d.experts));
  FSDP_CHECK_LAUNCH();
}

void moe_balancing_loss(const MoeLossDims& d, float* per_token, float* dscores,
                        const float* scores, const int32_t* indices, int32_t* counts,
                        bool counted, double coeff, stream_t stream) {
  if (d.tokens == 0 || d.experts == 0) return;
  const int64_t n = d.tokens / d.groups;
  if (!counted) moe_group_expert_counts(d, counts, indices, stream);
  const int warps = kThreads / kWarp;
  const unsigned blocks = unsigned((d.tokens + warps - 1) / warps);
  balancing_loss_kernel<<<blocks, kThreads, 0, stream>>>(
      per_token, dscores, scores, counts, d.tokens, int(d.experts), n,
      d.run_tokens > 0 ? d.run_tokens : n, int(d.top_k), 1.0 / double(d.groups), coeff, d.sigmoid);
  FSDP_CHECK_LAUNCH();
}

void moe_z_loss(const MoeLossDims& d, float* per_token, void* dlogits, const void* logits,
                double coeff, stream_t stream) {
  if (d.tokens == 0 || d.experts == 0) return;
  const int warps = kThreads / kWarp;
  const unsigned blocks = unsigned((d.tokens + warps - 1) / warps);
  dispatch_compute(d.dtype, "moe_z_loss", [&](auto tag) {
    using T = decltype(tag);
    z_loss_kernel<T><<<blocks, kThreads, 0, stream>>>(
        per_token, static_cast<T*>(dlogits), static_cast<const T*>(logits), d.tokens,
        int(d.experts), coeff);
    FSDP_CHECK_LAUNCH();
  });
}

}  // namespace fsdp::kernels::cuda
