// LayerNorm and RMSNorm on CUDA . One warp per row; statistics
// and all sums in f32. x and dx may be f32 beside bf16 weights and outputs (an f32 residual
// stream feeding a bf16 network). The parameter gradients are summed deterministically: each warp
// accumulates its rows into its own shared-memory row, a block adds its warps in order into
// one partial row, and finish_column_sums() adds the blocks in order.
#include <algorithm>

#include "kernels/cuda/column_sum.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/column_sum.h"
#include "kernels/cuda/vec.cuh"

namespace fsdp::kernels::cuda {
namespace {

constexpr int kForwardWarps = 8;                 // rows per forward block
constexpr int64_t kBackwardRowsPerBlock = 32;    // target; capped by kMaxBackwardBlocks
constexpr int64_t kMaxBackwardBlocks = 1024;
constexpr size_t kDefaultSharedBytes = 48 * 1024;

// With a residual: sum = x + residual (rounded to X, as the add kernel does) is stored and
// normalized; each lane re-reads only the elements it stored itself, so no barrier is needed.
template <int W, typename T, typename X, bool kRms>
__global__ void norm_forward_kernel(T* out, float* mean, float* rstd, const X* x,
                                    const T* residual, X* sum, const T* weight, const T* bias,
                                    int64_t rows, int64_t C, float eps) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (row >= rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x % kWarp;
  const X* xr = x + row * C;  // (C)
  if (residual) {
    for (int64_t c = lane * W; c < C; c += kWarp * W) {
      float v[W], r[W];
      load_floats<W>(xr + c, v);
      load_floats<W>(residual + row * C + c, r);
#pragma unroll
      for (int i = 0; i < W; ++i) v[i] += r[i];
      store_floats<W>(sum + row * C + c, v);
    }
    xr = sum + row * C;
  }
  float m = 0;
  if (!kRms) {
    float s = 0;
    for (int64_t c = lane * W; c < C; c += kWarp * W) {
      float v[W];
      load_floats<W>(xr + c, v);
#pragma unroll
      for (int i = 0; i < W; ++i) s += v[i];
    }
    m = warp_sum(s) / float(C);
  }
  float ss = 0;  // second pass over the (L1-resident) row: no cancellation
  for (int64_t c = lane * W; c < C; c += kWarp * W) {
    float v[W];
    load_floats<W>(xr + c, v);
#pragma unroll
    for (int i = 0; i < W; ++i) ss += (v[i] - m) * (v[i] - m);
  }
  const float r = rsqrtf(warp_sum(ss) / float(C) + eps);
  for (int64_t c = lane * W; c < C; c += kWarp * W) {
    float v[W], w[W], b[W] = {}, y[W];
    load_floats<W>(xr + c, v);
    load_floats<W>(weight + c, w);
    if (bias) load_floats<W>(bias + c, b);
#pragma unroll
    for (int i = 0; i < W; ++i) y[i] = (v[i] - m) * r * w[i] + b[i];
    store_floats<W>(out + row * C + c, y);
  }
  if (lane == 0) {
    if (!kRms) mean[row] = m;
    rstd[row] = r;
  }
}

// Block b handles rows [b * rows_per_block, ...): warp j of it rows j, j + warps, ...
// partials: (blocks, C) weight sums, then (blocks, C) bias sums.
template <int W, typename T, typename X, bool kRms>
// dx = dx_addend + the norm's gradient (dx_addend: null, dx itself, or another tensor).
__global__ void norm_backward_kernel(X* dx, const X* dx_addend, float* partials, const T* dout,
                                     const X* x, const T* weight, const float* mean,
                                     const float* rstd, int64_t rows, int64_t C,
                                     int64_t rows_per_block) {
  // (warps, 2, C) sums, each warp's row stored element-of-pack major: channel c = p * W + i
  // sits at i * (C / W) + p, so the 32 lanes of a warp touch 32 consecutive words (no bank
  // conflicts) when they update element i of their packs.
  extern __shared__ float sums[];
  const int warps = blockDim.x / kWarp, warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t packs = C / W;
  float* dw = sums + int64_t(warp) * 2 * C;
  float* db = dw + C;
  for (int64_t c = lane * W; c < C; c += kWarp * W)
#pragma unroll
    for (int i = 0; i < W; ++i) dw[i * packs + c / W] = db[i * packs + c / W] = 0.f;  // lane-owned
  const int64_t r0 = int64_t(blockIdx.x) * rows_per_block;
  const int64_t r1 = min(rows, r0 + rows_per_block);
  for (int64_t row = r0 + warp; row < r1; row += warps) {
    const float m = kRms ? 0.f : mean[row], r = rstd[row];
    const X* xr = x + row * C;
    const T* gr = dout + row * C;
    float sum_g = 0, sum_gx = 0;
    for (int64_t c = lane * W; c < C; c += kWarp * W) {
      float v[W], g[W], w[W];
      load_floats<W>(xr + c, v);
      load_floats<W>(gr + c, g);
      load_floats<W>(weight + c, w);
#pragma unroll
      for (int i = 0; i < W; ++i) {
        const float xhat = (v[i] - m) * r;
        sum_g += g[i] * w[i];
        sum_gx += g[i] * w[i] * xhat;
        dw[i * packs + c / W] += g[i] * xhat;
        db[i * packs + c / W] += g[i];
      }
    }
    if (!dx) continue;
    sum_g = kRms ? 0.f : warp_sum(sum_g) / float(C);
    sum_gx = warp_sum(sum_gx) / float(C);
    for (int64_t c = lane * W; c < C; c += kWarp * W) {
      float v[W], g[W], w[W], d[W], old[W] = {};
      load_floats<W>(xr + c, v);
      load_floats<W>(gr + c, g);
      load_floats<W>(weight + c, w);
      if (dx_addend) load_floats<W>(dx_addend + row * C + c, old);
#pragma unroll
      for (int i = 0; i < W; ++i) {
        const float xhat = (v[i] - m) * r;
        d[i] = old[i] + r * (g[i] * w[i] - sum_g - xhat * sum_gx);
      }
      store_floats<W>(dx + row * C + c, d);
    }
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const int64_t at = (c % W) * packs + c / W;
    float sw = 0, sb = 0;
    for (int j = 0; j < warps; ++j) {  // fixed warp order
      sw += sums[int64_t(j) * 2 * C + at];
      sb += sums[int64_t(j) * 2 * C + C + at];
    }
    partials[int64_t(blockIdx.x) * C + c] = sw;
    partials[int64_t(gridDim.x + blockIdx.x) * C + c] = sb;
  }
}

int64_t backward_blocks(int64_t rows) {
  return std::clamp<int64_t>((rows + kBackwardRowsPerBlock - 1) / kBackwardRowsPerBlock, 1,
                             kMaxBackwardBlocks);
}

// Warps per backward block: as many (up to 8) as fit two f32 rows of C each in 48 KiB.
int backward_warps(int64_t C) {
  return int(std::clamp<int64_t>(int64_t(kDefaultSharedBytes) / (2 * C * 4), 1, 8));
}

template <bool kRms>
void norm_forward(const NormDims& d, void* out, float* mean, float* rstd, const void* x,
                  const void* residual, void* sum, const void* weight, const void* bias,
                  double eps, stream_t stream) {
  if (d.rows == 0) return;
  const char* what = kRms ? "rmsnorm_forward" : "layernorm_forward";
  dispatch_compute(d.dtype, what, [&](auto tag) {
    using T = decltype(tag);
    dispatch_residual<T>(d.x_dtype, what, [&](auto xtag) {
      using X = decltype(xtag);
      dispatch_width<T>(d.channels, {out, x, residual, sum, weight, bias}, [&](auto w) {
        constexpr int W = decltype(w)::value;
        const unsigned blocks = unsigned((d.rows + kForwardWarps - 1) / kForwardWarps);
        norm_forward_kernel<W, T, X, kRms><<<blocks, kForwardWarps * kWarp, 0, stream>>>(
            static_cast<T*>(out), mean, rstd, static_cast<const X*>(x),
            static_cast<const T*>(residual), static_cast<X*>(sum), static_cast<const T*>(weight),
            static_cast<const T*>(bias), d.rows, d.channels, float(eps));
        FSDP_CHECK_LAUNCH();
      });
    });
  });
}

template <bool kRms>
void norm_backward(const NormDims& d, void* dx, const void* dx_addend, void* dweight, void* dbias,
                   const void* dout, const void* x, const void* weight, const float* mean,
                   const float* rstd, bool accumulate, void* workspace, stream_t stream) {
  if (d.channels == 0) return;
  const int64_t blocks = backward_blocks(d.rows);
  const int64_t rows_per_block = (d.rows + blocks - 1) / blocks;
  const int warps = backward_warps(d.channels);
  const size_t shared = size_t(warps) * 2 * size_t(d.channels) * sizeof(float);
  float* partials = static_cast<float*>(workspace);
  const char* what = kRms ? "rmsnorm_backward" : "layernorm_backward";
  dispatch_compute(d.dtype, what, [&](auto tag) {
    using T = decltype(tag);
    dispatch_residual<T>(d.x_dtype, what, [&](auto xtag) {
      using X = decltype(xtag);
      dispatch_width<T>(d.channels, {dx, dx_addend, dout, x, weight}, [&](auto w) {
        constexpr int W = decltype(w)::value;
        auto kernel = norm_backward_kernel<W, T, X, kRms>;
        if (shared > kDefaultSharedBytes)
          FSDP_CALL(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(shared)));
        kernel<<<unsigned(blocks), warps * kWarp, shared, stream>>>(
            static_cast<X*>(dx), static_cast<const X*>(dx_addend), partials,
            static_cast<const T*>(dout), static_cast<const X*>(x),
            static_cast<const T*>(weight), mean, rstd, d.rows, d.channels, rows_per_block);
        FSDP_CHECK_LAUNCH();
      });
    });
  });
  if (dweight)
    finish_column_sums(partials, blocks, d.channels, dweight, d.grad_dtype, accumulate, stream);
  if (dbias)
    finish_column_sums(partials + blocks * d.channels, blocks, d.channels, dbias, d.grad_dtype,
                       accumulate, stream);
}

}  // namespace

size_t norm_workspace_bytes(const NormDims& d) {
  return size_t(2 * backward_blocks(d.rows) * d.channels) * sizeof(float);
}

void layernorm_forward(const NormDims& d, void* out, float* mean, float* rstd, const void* x,
                       const void* residual, void* sum, const void* weight, const void* bias,
                       double eps, stream_t stream) {
  norm_forward<false>(d, out, mean, rstd, x, residual, sum, weight, bias, eps, stream);
}

void rmsnorm_forward(const NormDims& d, void* out, float* rstd, const void* x,
                     const void* residual, void* sum, const void* weight, double eps,
                     stream_t stream) {
  norm_forward<true>(d, out, nullptr, rstd, x, residual, sum, weight, nullptr, eps, stream);
}

void layernorm_backward(const NormDims& d, void* dx, const void* dx_addend, void* dweight,
                        void* dbias, const void* dout, const void* x, const void* weight,
                        const float* mean, const float* rstd, bool accumulate, void* workspace,
                        stream_t stream) {
  norm_backward<false>(d, dx, dx_addend, dweight, dbias, dout, x, weight, mean, rstd, accumulate,
                       workspace, stream);
}

void rmsnorm_backward(const NormDims& d, void* dx, const void* dx_addend, void* dweight,
                      const void* dout, const void* x, const void* weight, const float* rstd,
                      bool accumulate, void* workspace, stream_t stream) {
  norm_backward<true>(d, dx, dx_addend, dweight, nullptr, dout, x, weight, nullptr, rstd,
                      accumulate, workspace, stream);
}

}  // namespace fsdp::kernels::cuda
