// LayerNorm and RMSNorm on CUDA. Forward: one warp per row (held in registers up to 2048
// channels of bf16, 1024 of f32). Backward: one block per group of
// rows, the threads spread along the row. Statistics and all sums in f32. x and dx may be f32
// beside bf16 weights and outputs (an f32 residual stream feeding a bf16 network). The
// parameter gradients are summed deterministically: each thread sums its channels over its
// block's rows in row order, and finish_column_sums() adds the blocks in order.
#include <algorithm>

#include "kernels/cuda/column_sum.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/vec.cuh"

namespace fsdp::kernels::cuda {
namespace {

constexpr int kForwardWarps = 8;                 // rows per forward block
constexpr int64_t kBackwardRowsPerBlock = 32;    // target; capped by kMaxBackwardBlocks
constexpr int64_t kMaxBackwardBlocks = 1024;
// The register-resident backward: at most 512 threads of at most 16 channels each (so at
// most 128 registers per thread); wider rows take the shared-memory kernel.
constexpr int kMaxThreads = 512;
constexpr int64_t kMaxRegisterChannels = int64_t(kMaxThreads) * 16;
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

// Rows of up to kWarp * 64 channels are held in registers: lane `lane` keeps packs lane,
// lane + 32, ... (K packs of W) of its row, so the row is read from memory once, with all of
// a lane's loads issued together, and the mean, variance and output passes run on
// registers. The sums run in norm_forward_kernel's per-lane order (the same columns in
// the same order), and the sum with a residual is rounded to X as the stored one is.
constexpr int kMaxRowFloats = 64;

template <int W, int K, typename T, typename X, bool kRms>
__global__ void norm_forward_row_kernel(T* out, float* mean, float* rstd, const X* x,
                                        const T* residual, X* sum, const T* weight,
                                        const T* bias, int64_t rows, int64_t C, float eps) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (row >= rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x % kWarp;
  float v[K][W];  // (K, W): this lane's packs of the row
  bool own[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t c = (lane + int64_t(k) * kWarp) * W;
    own[k] = c < C;
    if (own[k]) load_floats<W>(x + row * C + c, v[k]);
  }
  if (residual) {
    float r[K][W];
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (own[k]) load_floats<W>(residual + row * C + (lane + int64_t(k) * kWarp) * W, r[k]);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!own[k]) continue;
#pragma unroll
      for (int i = 0; i < W; ++i) v[k][i] = to_float(from_float<X>(v[k][i] + r[k][i]));
      store_floats<W>(sum + row * C + (lane + int64_t(k) * kWarp) * W, v[k]);
    }
  }
  float m = 0;
  if (!kRms) {
    float s = 0;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (own[k]) {
#pragma unroll
        for (int i = 0; i < W; ++i) s += v[k][i];
      }
    m = warp_sum(s) / float(C);
  }
  float ss = 0;
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (own[k]) {
#pragma unroll
      for (int i = 0; i < W; ++i) ss += (v[k][i] - m) * (v[k][i] - m);
    }
  const float r = rsqrtf(warp_sum(ss) / float(C) + eps);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (!own[k]) continue;
    const int64_t c = (lane + int64_t(k) * kWarp) * W;
    float w[W], b[W] = {}, y[W];
    load_floats<W>(weight + c, w);
    if (bias) load_floats<W>(bias + c, b);
#pragma unroll
    for (int i = 0; i < W; ++i) y[i] = (v[k][i] - m) * r * w[i] + b[i];
    store_floats<W>(out + row * C + c, y);
  }
  if (lane == 0) {
    if (!kRms) mean[row] = m;
    rstd[row] = r;
  }
}

// W elements of T as loaded: 16-bit types stay 16-bit in registers and are converted on use,
// so a thread can hold more rows in flight.
template <int W, typename T>
struct alignas((W * sizeof(T)) % 16 == 0 ? 16 : alignof(T)) Raw {
  T v[W];
  __device__ __forceinline__ void load(const T* p) {
    if constexpr ((W * sizeof(T)) % 16 == 0) {
#pragma unroll
      for (int k = 0; k < int(W * sizeof(T) / 16); ++k)
        reinterpret_cast<int4*>(v)[k] = reinterpret_cast<const int4*>(p)[k];
    } else {
#pragma unroll
      for (int i = 0; i < W; ++i) v[i] = p[i];
    }
  }
  __device__ __forceinline__ float operator[](int i) const { return to_float(v[i]); }
};

// Block b handles rows [b * rows_per_block, ...), R at a time (2 with 8 channels per thread;
// 1 with 16, within the 128 registers of a 512-thread block), all its threads on each
// row: thread t owns packs t, t + threads, ... (E channels in K = E / W packs of W), so the
// weight and the weight and bias gradient sums of its channels stay in registers for all of
// the block's rows, and each row of x, dout and dx_addend is read from memory once, all
// three issued together for the R rows. Between the two halves, one block-wide sum of
// (g·w, g·w·x̂) per row; its shared buffer alternates between iterations, so one barrier per
// iteration suffices. partials: (blocks, C) weight sums, then (blocks, C) bias sums.
// dx = dx_addend + the norm's gradient (dx_addend: null, dx itself, or another tensor).
template <int W, int E, typename T, typename X, bool kRms>
__global__ void __launch_bounds__(kMaxThreads)
    norm_backward_kernel(X* dx, const X* dx_addend, float* partials, const T* dout, const X* x,
                         const T* weight, const float* mean, const float* rstd, int64_t rows,
                         int64_t C, int64_t rows_per_block) {
  constexpr int K = E / W, R = E == 8 ? 2 : 1;
  // (iteration parity, warp): the warp's (Σ g·w, Σ g·w·x̂) of the iteration's rows 0 and 1.
  __shared__ float4 warp_sums[2][kWarp];
  const int warps = blockDim.x / kWarp, warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t packs = C / W;
  bool own[K];
  Raw<W, T> w[K];
  float dw[K][W], db[K][W];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t p = threadIdx.x + int64_t(k) * blockDim.x;
    own[k] = p < packs;
#pragma unroll
    for (int i = 0; i < W; ++i) dw[k][i] = db[k][i] = 0.f;
    if (own[k]) w[k].load(weight + p * W);
  }
  const int64_t r0 = int64_t(blockIdx.x) * rows_per_block;
  const int64_t r1 = min(rows, r0 + rows_per_block);
  for (int64_t row0 = r0; row0 < r1; row0 += R) {
    Raw<W, X> xs[R][K], adds[R][K];
    Raw<W, T> gs[R][K];
    float m[R], rs[R], sum_g[R], sum_gx[R];
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int64_t row = row0 + j;
      const bool valid = row < r1;  // the same for every thread of the block
      m[j] = valid && !kRms ? mean[row] : 0.f;
      rs[j] = valid ? rstd[row] : 0.f;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (!own[k] || !valid) continue;
        const int64_t at = row * C + (threadIdx.x + int64_t(k) * blockDim.x) * W;
        xs[j][k].load(x + at);
        gs[j][k].load(dout + at);
        if (dx_addend) adds[j][k].load(dx_addend + at);
      }
    }
#pragma unroll
    for (int j = 0; j < R; ++j) {
      sum_g[j] = sum_gx[j] = 0.f;
      if (row0 + j >= r1) continue;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (!own[k]) continue;
#pragma unroll
        for (int i = 0; i < W; ++i) {
          const float g = gs[j][k][i], xhat = (xs[j][k][i] - m[j]) * rs[j], gw = g * w[k][i];
          sum_g[j] += gw;
          sum_gx[j] += gw * xhat;
          dw[k][i] += g * xhat;
          if (!kRms) db[k][i] += g;
        }
      }
    }
    if (!dx) continue;  // the same for every thread of the block
    float4* slot = warp_sums[(row0 - r0) / R & 1];
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    s.y = warp_sum(sum_gx[0]);
    if (!kRms) s.x = warp_sum(sum_g[0]);
    if constexpr (R == 2) {
      s.w = warp_sum(sum_gx[1]);
      if (!kRms) s.z = warp_sum(sum_g[1]);
    }
    if (lane == 0) slot[warp] = s;
    __syncthreads();
    s = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int j = 0; j < warps; ++j) {  // fixed warp order: every thread gets the same sums
      s.x += slot[j].x;
      s.y += slot[j].y;
      s.z += slot[j].z;
      s.w += slot[j].w;
    }
    sum_g[0] = s.x / float(C), sum_gx[0] = s.y / float(C);
    if constexpr (R == 2) sum_g[1] = s.z / float(C), sum_gx[1] = s.w / float(C);
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int64_t row = row0 + j;
      if (row >= r1) continue;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (!own[k]) continue;
        float d[W];
#pragma unroll
        for (int i = 0; i < W; ++i) {
          const float xhat = (xs[j][k][i] - m[j]) * rs[j];
          d[i] = (dx_addend ? adds[j][k][i] : 0.f) +
                 rs[j] * (gs[j][k][i] * w[k][i] - sum_g[j] - xhat * sum_gx[j]);
        }
        store_floats<W>(dx + row * C + (threadIdx.x + int64_t(k) * blockDim.x) * W, d);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (!own[k]) continue;
    const int64_t c = (threadIdx.x + int64_t(k) * blockDim.x) * W;
#pragma unroll
    for (int i = 0; i < W; ++i) {
      partials[int64_t(blockIdx.x) * C + c + i] = dw[k][i];
      if (!kRms) partials[int64_t(gridDim.x + blockIdx.x) * C + c + i] = db[k][i];
    }
  }
}

// Rows too wide for registers (more than kMaxRegisterChannels): block b handles rows
// [b * rows_per_block, ...), warp j of it rows j, j + warps, ..., each warp summing its rows'
// weight and bias gradients into its own shared-memory row; the block adds its warps in order.
// partials as above.
template <int W, typename T, typename X, bool kRms>
__global__ void norm_backward_wide_kernel(X* dx, const X* dx_addend, float* partials,
                                          const T* dout, const X* x, const T* weight,
                                          const float* mean, const float* rstd, int64_t rows,
                                          int64_t C, int64_t rows_per_block) {
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

// Warps per wide-row backward block: as many (up to 8) as fit two f32 rows of C each in
// 48 KiB.
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
        auto launch = [&](auto kernel) {
          kernel<<<blocks, kForwardWarps * kWarp, 0, stream>>>(
              static_cast<T*>(out), mean, rstd, static_cast<const X*>(x),
              static_cast<const T*>(residual), static_cast<X*>(sum),
              static_cast<const T*>(weight), static_cast<const T*>(bias), d.rows, d.channels,
              float(eps));
          FSDP_CHECK_LAUNCH();
        };
        // Packs per lane for the row in registers: 2, 4 or 8 (8 packs of 8 bf16 or of 4 f32
        // are the most a lane holds: 64 floats).
        const int64_t packs = (d.channels + int64_t(kWarp) * W - 1) / (int64_t(kWarp) * W);
        if constexpr (W > 1) {
          static_assert(8 * W <= kMaxRowFloats, "a lane's 8 packs fit its registers");
          if (packs <= 2) return launch(norm_forward_row_kernel<W, 2, T, X, kRms>);
          if (packs <= 4) return launch(norm_forward_row_kernel<W, 4, T, X, kRms>);
          if (packs <= 8) return launch(norm_forward_row_kernel<W, 8, T, X, kRms>);
        }
        launch(norm_forward_kernel<W, T, X, kRms>);
      });
    });
  });
}

template <bool kRms>
void norm_backward(const NormDims& d, void* dx, const void* dx_addend, void* dweight, void* dbias,
                   const void* dout, const void* x, const void* weight, const float* mean,
                   const float* rstd, bool accumulate, void* workspace, stream_t stream) {
  if (d.channels == 0) return;
  // At most backward_blocks(rows) blocks: the workspace holds that many partial rows.
  int64_t blocks = backward_blocks(d.rows);
  float* partials = static_cast<float*>(workspace);
  const char* what = kRms ? "rmsnorm_backward" : "layernorm_backward";
  dispatch_compute(d.dtype, what, [&](auto tag) {
    using T = decltype(tag);
    dispatch_residual<T>(d.x_dtype, what, [&](auto xtag) {
      using X = decltype(xtag);
      dispatch_width<T>(d.channels, {dx, dx_addend, dout, x, weight}, [&](auto w) {
        constexpr int W = decltype(w)::value;
        const X* xp = static_cast<const X*>(x);
        const T* dp = static_cast<const T*>(dout);
        const T* wp = static_cast<const T*>(weight);
        X* dxp = static_cast<X*>(dx);
        const X* addp = static_cast<const X*>(dx_addend);
        if (d.channels > kMaxRegisterChannels) {
          const int64_t rows_per_block = (d.rows + blocks - 1) / blocks;
          const int warps = backward_warps(d.channels);
          const size_t shared = size_t(warps) * 2 * size_t(d.channels) * sizeof(float);
          auto kernel = norm_backward_wide_kernel<W, T, X, kRms>;
          if (shared > kDefaultSharedBytes)
            FSDP_CALL(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(shared)));
          kernel<<<unsigned(blocks), warps * kWarp, shared, stream>>>(
              dxp, addp, partials, dp, xp, wp, mean, rstd, d.rows, d.channels, rows_per_block);
          FSDP_CHECK_LAUNCH();
          return;
        }
        // 8 channels per thread up to 4096 channels, 16 beyond.
        const bool wide = d.channels > int64_t(kMaxThreads) * 8;
        const int64_t per_thread = wide ? 16 : 8;
        const int threads =
            int((d.channels + per_thread * kWarp - 1) / (per_thread * kWarp) * kWarp);
        auto kernel = wide ? norm_backward_kernel<W, 16, T, X, kRms>
                           : norm_backward_kernel<W, 8, T, X, kRms>;
        // One wave: as many blocks as the GPU holds at once (a second, partial wave would run
        // a few blocks of many rows each on a nearly idle GPU). The grid depends on the
        // device, so the sums' order is fixed for a given GPU model.
        int device = 0, sms = 0, per_sm = 0;
        FSDP_CALL(cudaGetDevice(&device));
        FSDP_CALL(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
        FSDP_CALL(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
        blocks = std::clamp<int64_t>(int64_t(sms) * per_sm, 1, blocks);
        const int64_t rows_per_block = (d.rows + blocks - 1) / blocks;
        kernel<<<unsigned(blocks), unsigned(threads), 0, stream>>>(
            dxp, addp, partials, dp, xp, wp, mean, rstd, d.rows, d.channels, rows_per_block);
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
