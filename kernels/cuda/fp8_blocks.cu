#include "kernels/cuda/fp8_blocks.h"

#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_encode.cuh"
#include "kernels/cuda/fp8_tile.cuh"
#include "kernels/cuda/vec.cuh"

namespace fsdp::kernels::cuda {
namespace {

constexpr int kTile = 128;         // a block of threads quantizes a (128, 128) tile
constexpr int kThreads = 256;      // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kBytesPitch = kTile + 16;  // a row of the transposed bytes: 16-byte aligned rows

// The tile of x as read (T), a row padded so that a column read (row = lane + 32 j) falls on
// distinct banks: 130 two-byte elements (65 words) or 129 four-byte ones.
template <typename T>
constexpr int pitch_of() { return sizeof(T) == 2 ? kTile + 2 : kTile + 1; }
template <typename T>
constexpr size_t tile_bytes() {
  return size_t(kTile) * pitch_of<T>() * sizeof(T) + size_t(kTile) * kBytesPitch;
}

// One (128, 128) tile of x: rows [r0, r0 + nr), columns [c0, c0 + nc), held in shared memory
// as read (zeros outside x, which change no amax and no sum): global loads of 16 bytes where
// the rows allow. 1x128: each warp takes rows of the tile for q (a block is a row's 128
// columns: a lane scales 4 consecutive columns and stores their 4 bytes at once), then
// columns for qt (a block is a column's 128 rows: lane + 32 j), whose bytes gather in shared
// memory and leave as 16-byte stores of whole rows of qt; 128x128: the whole tile is one
// block, written the same ways.
template <typename T, bool kVec, bool kSums>
__global__ void __launch_bounds__(kThreads)
    quantize_blocks_kernel(const T* x, int64_t rows, int64_t cols, Fp8Format format,
                           Fp8Granularity granularity, uint8_t* q, float* q_scale_inv,
                           uint8_t* qt, float* qt_scale_inv, float* partials) {
  constexpr int kPitch = pitch_of<T>();
  extern __shared__ __align__(16) unsigned char smem[];
  T* tile = reinterpret_cast<T*>(smem);                                    // [kTile][kPitch]
  uint8_t* tbytes = smem + size_t(kTile) * kPitch * sizeof(T);             // [kTile][kBytesPitch]
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  const int nr = rows - r0 < kTile ? int(rows - r0) : kTile;
  const int nc = cols - c0 < kTile ? int(cols - c0) : kTile;
  const bool whole = nr == kTile && nc == kTile;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const T zero = from_float<T>(0.0f);

  constexpr int kPer = 16 / int(sizeof(T));  // elements per 16-byte load
  if (kVec && whole) {
    for (int i = threadIdx.x; i < kTile * kTile / kPer; i += kThreads) {
      const int rr = i / (kTile / kPer), cc = (i % (kTile / kPer)) * kPer;
      const Pack<T> v = load_pack(x + (r0 + rr) * cols + c0 + cc);
      if constexpr (sizeof(T) == 2) {  // pairs: 4-byte aligned, as kPitch and cc are even
        const auto* words = reinterpret_cast<const uint32_t*>(&v);
        auto* dst = reinterpret_cast<uint32_t*>(tile + rr * kPitch + cc);
#pragma unroll
        for (int j = 0; j < kPer / 2; ++j) dst[j] = words[j];
      } else {
#pragma unroll
        for (int j = 0; j < kPer; ++j) tile[rr * kPitch + cc + j] = v.v[j];
      }
    }
  } else {
    for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
      const int rr = i / kTile, cc = i % kTile;  // consecutive threads: consecutive columns
      tile[rr * kPitch + cc] = rr < nr && cc < nc ? x[(r0 + rr) * cols + c0 + cc] : zero;
    }
  }
  __syncthreads();
  auto at = [&](int rr, int cc) { return to_float(tile[rr * kPitch + cc]); };

  if (kSums) {  // each column's sum over the tile's rows: lane order, then a fixed tree
    for (int cc = warp; cc < nc; cc += kWarps) {
      float s = 0.0f;
#pragma unroll
      for (int j = 0; j < kTile / 32; ++j) s += at(lane + 32 * j, cc);
      s = warp_sum(s);
      if (lane == 0) partials[int64_t(blockIdx.y) * cols + c0 + cc] = s;
    }
  }

  const bool square = granularity == Fp8Granularity::block_128x128;
  float tile_scale = 0.0f;
  if (square) {
    float m = 0.0f;
    for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) m = fmaxf(m, fabsf(at(i / kTile, i % kTile)));
    tile_scale = fp8_scale_for_amax(block_max(m), format);
    if (threadIdx.x == 0) {
      const float inv = __frcp_rn(tile_scale);
      if (q) q_scale_inv[fp8_scale_index(granularity, rows, cols, r0, c0)] = inv;
      if (qt) qt_scale_inv[fp8_scale_index(granularity, cols, rows, c0, r0)] = inv;
    }
  }

  // q: a row of the tile per warp; lane scales columns 4 lane .. 4 lane + 3 (0 past nc).
  const bool vec_q = kVec && nc == kTile;
  if (q)
    for (int rr = warp; rr < nr; rr += kWarps) {
      float v[4];
      float m = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[j] = at(rr, 4 * lane + j);
        m = fmaxf(m, fabsf(v[j]));
      }
      float scale = tile_scale;
      if (!square) {
        scale = fp8_scale_for_amax(warp_max(m), format);
        if (lane == 0) q_scale_inv[fp8_scale_index(granularity, rows, cols, r0 + rr, c0)] = __frcp_rn(scale);
      }
      uint8_t b[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = fp8_encode_satfinite(__fmul_rn(v[j], scale), format);
      uint8_t* dst = q + (r0 + rr) * cols + c0 + 4 * lane;
      if (vec_q) {
        *reinterpret_cast<uint32_t*>(dst) = uint32_t(b[0]) | uint32_t(b[1]) << 8 |
                                            uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
      } else {
        for (int j = 0; j < 4 && 4 * lane + j < nc; ++j) dst[j] = b[j];
      }
    }
  if (!qt) return;

  // qt: a column of the tile per warp (lane + 32 j down its rows), its bytes into tbytes.
  for (int cc = warp; cc < nc; cc += kWarps) {
    float v[kTile / 32];
    float m = 0.0f;
#pragma unroll
    for (int j = 0; j < kTile / 32; ++j) {
      v[j] = at(lane + 32 * j, cc);
      m = fmaxf(m, fabsf(v[j]));
    }
    float scale = tile_scale;
    if (!square) {
      scale = fp8_scale_for_amax(warp_max(m), format);
      if (lane == 0) qt_scale_inv[fp8_scale_index(granularity, cols, rows, c0 + cc, r0)] = __frcp_rn(scale);
    }
#pragma unroll
    for (int j = 0; j < kTile / 32; ++j)
      tbytes[cc * kBytesPitch + lane + 32 * j] = fp8_encode_satfinite(__fmul_rn(v[j], scale), format);
  }
  __syncthreads();
  // Whole rows of qt (its row c0 + cc, columns r0 ..) as 16-byte stores where they fit.
  if (kVec && nr == kTile && rows % 16 == 0) {
    for (int i = threadIdx.x; i < nc * (kTile / 16); i += kThreads) {
      const int cc = i / (kTile / 16), k = (i % (kTile / 16)) * 16;
      *reinterpret_cast<int4*>(qt + (c0 + cc) * rows + r0 + k) =
          *reinterpret_cast<const int4*>(tbytes + cc * kBytesPitch + k);
    }
  } else {
    for (int i = threadIdx.x; i < nc * kTile; i += kThreads) {
      const int cc = i / kTile, rr = i % kTile;
      if (rr < nr) qt[(c0 + cc) * rows + r0 + rr] = tbytes[cc * kBytesPitch + rr];
    }
  }
}

}  // namespace

int64_t fp8_block_column_sum_tiles(int64_t rows) { return (rows + kTile - 1) / kTile; }

void fp8_quantize_blocks(const void* x, DType dtype, int64_t rows, int64_t cols, Fp8Format format,
                         Fp8Granularity granularity, uint8_t* q, float* q_scale_inv, uint8_t* qt,
                         float* qt_scale_inv, const ColumnSums& column_sums, stream_t stream) {
  float* partials = column_sums.out ? column_sums.partials : nullptr;
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
  // 16-byte loads of x's rows and 4- and 16-byte stores of q's and qt's: the rows of all
  // three start aligned.
  const bool vec = cols % 16 == 0 && aligned16(x) && uintptr_t(q) % 16 == 0 &&
                   uintptr_t(qt) % 16 == 0;
  auto launch = [&](auto tag, auto vec_tag, auto sums) {
    using T = decltype(tag);
    constexpr bool kVec = decltype(vec_tag)::value, kSums = decltype(sums)::value;
    constexpr size_t kBytes = tile_bytes<T>();
    if (capturing == cudaStreamCaptureStatusNone)
      FSDP_CALL(cudaFuncSetAttribute(quantize_blocks_kernel<T, kVec, kSums>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, int(kBytes)));
    quantize_blocks_kernel<T, kVec, kSums><<<grid, kThreads, kBytes, stream>>>(
        static_cast<const T*>(x), rows, cols, format, granularity, q, q_scale_inv, qt,
        qt_scale_inv, partials);
  };
  auto with_sums = [&](auto tag) {
    using yes = std::true_type;
    using no = std::false_type;
    if (vec && partials) launch(tag, yes{}, yes{});
    else if (vec) launch(tag, yes{}, no{});
    else if (partials) launch(tag, no{}, yes{});
    else launch(tag, no{}, no{});
  };
  fp8_tile::dispatch_cast_input(dtype, "fp8_quantize_blocks", with_sums);
  FSDP_CHECK_LAUNCH();
  if (partials)
    finish_column_sums(partials, fp8_block_column_sum_tiles(rows), cols, column_sums.out,
                       column_sums.out_dtype, true, stream);
}

}  // namespace fsdp::kernels::cuda
