#include "kernels/cuda/fp8_blocks.h"

#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_encode.cuh"

namespace fsdp::kernels::cuda {
namespace {

constexpr int kTile = 128;             // a block of threads quantizes a (128, 128) tile
constexpr int kPitch = kTile + 1;      // floats per row of the tile in shared memory: column
                                       // reads (row = lane + 32 j) then fall on distinct banks
constexpr int kThreads = 256;          // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr size_t kTileBytes = size_t(kTile) * kPitch * sizeof(float);  // 66 KB: dynamic

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {  // a fixed tree: deterministic
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One (128, 128) tile of x: rows [r0, r0 + nr), columns [c0, c0 + nc), held as floats in
// shared memory (zeros outside x, which change no amax and no sum). 1x128: each warp takes
// rows of the tile for q (a block is a row's 128 columns) and then columns for qt (a block
// is a column's 128 rows); 128x128: the whole tile is one block. Each lane reads elements
// lane + 32 j, so every byte store of a warp writes 32 consecutive bytes.
template <typename T, bool kSums>
__global__ void __launch_bounds__(kThreads)
    quantize_blocks_kernel(const T* x, int64_t rows, int64_t cols, Fp8Format format,
                           Fp8Granularity granularity, uint8_t* q, float* q_scale_inv,
                           uint8_t* qt, float* qt_scale_inv, float* partials) {
  extern __shared__ float tile[];  // [kTile][kPitch]
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  const int nr = rows - r0 < kTile ? int(rows - r0) : kTile;
  const int nc = cols - c0 < kTile ? int(cols - c0) : kTile;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
    const int rr = i / kTile, cc = i % kTile;  // consecutive threads: consecutive columns
    tile[rr * kPitch + cc] = rr < nr && cc < nc ? to_float(x[(r0 + rr) * cols + c0 + cc]) : 0.0f;
  }
  __syncthreads();

  if (kSums) {  // each column's sum over the tile's rows: lane order, then a fixed tree
    for (int cc = warp; cc < nc; cc += kWarps) {
      float s = 0.0f;
#pragma unroll
      for (int j = 0; j < kTile / 32; ++j) s += tile[(lane + 32 * j) * kPitch + cc];
      s = warp_sum(s);
      if (lane == 0) partials[int64_t(blockIdx.y) * cols + c0 + cc] = s;
    }
  }

  if (granularity == Fp8Granularity::block_128x128) {
    float m = 0.0f;
    for (int i = threadIdx.x; i < kTile * kTile; i += kThreads)
      m = fmaxf(m, fabsf(tile[(i / kTile) * kPitch + i % kTile]));
    const float scale = fp8_scale_for_amax(block_max(m), format);
    if (threadIdx.x == 0) {
      const float inv = __frcp_rn(scale);
      if (q) q_scale_inv[fp8_scale_index(granularity, rows, cols, r0, c0)] = inv;
      if (qt) qt_scale_inv[fp8_scale_index(granularity, cols, rows, c0, r0)] = inv;
    }
    if (q)
      for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
        const int rr = i / kTile, cc = i % kTile;
        if (rr < nr && cc < nc)
          q[(r0 + rr) * cols + c0 + cc] = fp8_encode_satfinite(__fmul_rn(tile[rr * kPitch + cc], scale), format);
      }
    if (qt)
      for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
        const int cc = i / kTile, rr = i % kTile;  // consecutive threads: consecutive rows
        if (rr < nr && cc < nc)
          qt[(c0 + cc) * rows + r0 + rr] = fp8_encode_satfinite(__fmul_rn(tile[rr * kPitch + cc], scale), format);
      }
    return;
  }

  if (q)  // 1x128 along the columns: one block per row of the tile
    for (int rr = warp; rr < nr; rr += kWarps) {
      float v[kTile / 32];
      float m = 0.0f;
#pragma unroll
      for (int j = 0; j < kTile / 32; ++j) {
        v[j] = tile[rr * kPitch + lane + 32 * j];
        m = fmaxf(m, fabsf(v[j]));
      }
      const float scale = fp8_scale_for_amax(warp_max(m), format);
      if (lane == 0) q_scale_inv[fp8_scale_index(granularity, rows, cols, r0 + rr, c0)] = __frcp_rn(scale);
#pragma unroll
      for (int j = 0; j < kTile / 32; ++j) {
        const int cc = lane + 32 * j;
        if (cc < nc) q[(r0 + rr) * cols + c0 + cc] = fp8_encode_satfinite(__fmul_rn(v[j], scale), format);
      }
    }
  if (qt)  // 1x128 along the rows: one block per column of the tile
    for (int cc = warp; cc < nc; cc += kWarps) {
      float v[kTile / 32];
      float m = 0.0f;
#pragma unroll
      for (int j = 0; j < kTile / 32; ++j) {
        v[j] = tile[(lane + 32 * j) * kPitch + cc];
        m = fmaxf(m, fabsf(v[j]));
      }
      const float scale = fp8_scale_for_amax(warp_max(m), format);
      if (lane == 0) qt_scale_inv[fp8_scale_index(granularity, cols, rows, c0 + cc, r0)] = __frcp_rn(scale);
#pragma unroll
      for (int j = 0; j < kTile / 32; ++j) {
        const int rr = lane + 32 * j;
        if (rr < nr) qt[(c0 + cc) * rows + r0 + rr] = fp8_encode_satfinite(__fmul_rn(v[j], scale), format);
      }
    }
}

}  // namespace

int64_t fp8_block_column_sum_tiles(int64_t rows) { return (rows + kTile - 1) / kTile; }

void fp8_quantize_blocks(const void* x, DType dtype, int64_t rows, int64_t cols, Fp8Format format,
                         Fp8Granularity granularity, uint8_t* q, float* q_scale_inv, uint8_t* qt,
                         float* qt_scale_inv, float* partials, stream_t stream) {
  FSDP_CHECK(granularity != Fp8Granularity::tensor, ValueError,
             "fp8_quantize_blocks: tensor-wise scaling goes through fp8_quantize");
  FSDP_CHECK(rows > 0 && cols > 0 && fp8_blocks(rows) < 65536, ValueError,
             "fp8_quantize_blocks: (", rows, ", ", cols, ") is empty or has too many rows");
  FSDP_CHECK(!q == !q_scale_inv && !qt == !qt_scale_inv, ValueError,
             "fp8_quantize_blocks: each layout needs its bytes and its scales");
  const dim3 grid(unsigned(fp8_blocks(cols)), unsigned(fp8_blocks(rows)));
  // The tile is larger than the 48 KB a launch gets without asking. The attribute stays set
  // for the kernel, so it is asked outside CUDA-graph capture only (graphs are captured
  // after an eager warm-up, which sets it).
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  FSDP_CALL(cudaStreamIsCapturing(stream, &capturing));
  auto launch = [&](auto tag, auto sums) {
    using T = decltype(tag);
    constexpr bool kSums = decltype(sums)::value;
    if (capturing == cudaStreamCaptureStatusNone)
      FSDP_CALL(cudaFuncSetAttribute(quantize_blocks_kernel<T, kSums>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, int(kTileBytes)));
    quantize_blocks_kernel<T, kSums><<<grid, kThreads, kTileBytes, stream>>>(
        static_cast<const T*>(x), rows, cols, format, granularity, q, q_scale_inv, qt,
        qt_scale_inv, partials);
  };
  auto with_sums = [&](auto tag) {
    if (partials) launch(tag, std::true_type{});
    else launch(tag, std::false_type{});
  };
  switch (dtype) {
    case DType::f32: with_sums(float{}); break;
    case DType::bf16: with_sums(bf16_t{}); break;
    case DType::f16: with_sums(f16_t{}); break;
    default:
      FSDP_THROW(DTypeError, "fp8_quantize_blocks: bf16, f16 or f32 input expected, got ",
                 dtype_name(dtype));
  }
  FSDP_CHECK_LAUNCH();
}

}  // namespace fsdp::kernels::cuda
