#include "kernels/cuda/fp8_rows.h"

#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/fp8_encode.cuh"
#include "kernels/cuda/vec.cuh"

namespace fsdp::kernels::cuda {
namespace {

constexpr int kTileRows = 64, kTileCols = 128;  // a block of threads takes a (64, 128) tile
constexpr int kThreads = 256;
constexpr int kRowGroups = kThreads / 16;        // 16 threads of 8 columns span a tile row

// One block per row: its max |x| (fmaxf skips NaNs).
template <typename T>
__global__ void row_amax_kernel(const T* x, int64_t cols, float* amax) {
  const T* row = x + int64_t(blockIdx.x) * cols;
  float m = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, fabsf(to_float(row[c])));
  m = block_max(m);
  if (threadIdx.x == 0) amax[blockIdx.x] = m;
}

// Each thread folds 8 consecutive columns of some rows of a (64, 128) tile; the block's
// maximum per column goes into amax_bits (zeroed before) with an integer atomicMax: for
// non-negative floats the bit patterns order as the values do.
template <typename T>
__global__ void column_amax_kernel(const T* x, int64_t rows, int64_t cols, unsigned* amax_bits) {
  __shared__ float part[kRowGroups][kTileCols];
  const int64_t r0 = int64_t(blockIdx.y) * kTileRows, c0 = int64_t(blockIdx.x) * kTileCols;
  const int col8 = (threadIdx.x % 16) * 8, sub = threadIdx.x / 16;
  float m[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int rr = sub; rr < kTileRows && r0 + rr < rows; rr += kRowGroups) {
    const int64_t r = r0 + rr;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t c = c0 + col8 + j;
      if (c < cols) m[j] = fmaxf(m[j], fabsf(to_float(x[r * cols + c])));
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) part[sub][col8 + j] = m[j];
  __syncthreads();
  if (threadIdx.x < kTileCols && c0 + threadIdx.x < cols) {
    float t = 0.0f;
    for (int g = 0; g < kRowGroups; ++g) t = fmaxf(t, part[g][threadIdx.x]);
    atomicMax(amax_bits + c0 + threadIdx.x, __float_as_uint(t));
  }
}

// q and qt of one (64, 128) tile, as fp8.cu's quantize_kernel lays them out (8 columns of a
// row per thread into q, the tile's bytes through shared memory into 8 rows of a column of
// qt: both writes coalesced, each element read once), with q's bytes scaled by their row's
// scale and qt's by their column's. With kSums, the tile's column sums of x go to partials.
template <typename T, bool kVec, bool kSums>
__global__ void quantize_rowwise_kernel(const T* x, int64_t rows, int64_t cols, Fp8Format format,
                                        const float* row_amax, uint8_t* q,
                                        const float* column_amax, uint8_t* qt, float* partials) {
  __shared__ __align__(8) uint8_t tile[kTileRows][kTileCols + 8];
  __shared__ float sums[kSums ? kRowGroups : 1][kSums ? kTileCols : 1];
  const int64_t r0 = int64_t(blockIdx.y) * kTileRows, c0 = int64_t(blockIdx.x) * kTileCols;
  const int col8 = (threadIdx.x % 16) * 8, sub = threadIdx.x / 16;
  float column_scale[8], acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int64_t c = c0 + col8 + j;
    column_scale[j] = qt && c < cols ? fp8_scale_for_amax(column_amax[c], format) : 1.0f;
  }
  for (int rr = sub; rr < kTileRows; rr += kRowGroups) {
    const int64_t r = r0 + rr, c = c0 + col8;
    if (r >= rows) break;
    float v[8];
    if (kVec && c + 7 < cols) {
      load_floats<8>(x + r * cols + c, v);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = c + j < cols ? to_float(x[r * cols + c + j]) : 0.0f;
    }
    if (kSums) {
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += v[j];
    }
    uint8_t b[8];
    if (qt) {
#pragma unroll
      for (int j = 0; j < 8; ++j) b[j] = fp8_encode_satfinite(__fmul_rn(v[j], column_scale[j]), format);
      *reinterpret_cast<uint2*>(&tile[rr][col8]) = fp8_pack8(b);
    }
    if (!q) continue;
    const float row_scale = fp8_scale_for_amax(row_amax[r], format);
#pragma unroll
    for (int j = 0; j < 8; ++j) b[j] = fp8_encode_satfinite(__fmul_rn(v[j], row_scale), format);
    if (kVec && c + 7 < cols) {
      *reinterpret_cast<uint2*>(q + r * cols + c) = fp8_pack8(b);
    } else {
      for (int j = 0; j < 8 && c + j < cols; ++j) q[r * cols + c + j] = b[j];
    }
  }
  if (kSums) {
#pragma unroll
    for (int j = 0; j < 8; ++j) sums[sub][col8 + j] = acc[j];
    __syncthreads();
    if (threadIdx.x < kTileCols && c0 + threadIdx.x < cols) {
      float total = 0.0f;
      for (int g = 0; g < kRowGroups; ++g) total += sums[g][threadIdx.x];
      partials[int64_t(blockIdx.y) * cols + c0 + threadIdx.x] = total;
    }
  }
  if (!qt) return;
  __syncthreads();
  const bool vec_qt = kVec && rows % 8 == 0;
  const int row8 = (threadIdx.x % 8) * 8, csub = threadIdx.x / 8;  // 32 columns per pass
  for (int cc = csub; cc < kTileCols; cc += kThreads / 8) {
    const int64_t c = c0 + cc, r = r0 + row8;
    if (c >= cols) break;
    if (r >= rows) continue;
    uint8_t b[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) b[j] = tile[row8 + j][cc];
    if (vec_qt && r + 7 < rows) {
      *reinterpret_cast<uint2*>(qt + c * rows + r) = fp8_pack8(b);
    } else {
      for (int j = 0; j < 8 && r + j < rows; ++j) qt[c * rows + r + j] = b[j];
    }
  }
}

template <typename F>
void dispatch_16_32(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::f32: f(float{}); return;
    case DType::bf16: f(bf16_t{}); return;
    case DType::f16: f(f16_t{}); return;
    default: FSDP_THROW(DTypeError, what, ": bf16, f16 or f32 input expected, got ", dtype_name(dtype));
  }
}

dim3 tile_grid(int64_t rows, int64_t cols, const char* what) {
  FSDP_CHECK(rows > 0 && cols > 0 && (rows + kTileRows - 1) / kTileRows < 65536, ValueError, what,
             ": (", rows, ", ", cols, ") is empty or has too many rows");
  return dim3(unsigned((cols + kTileCols - 1) / kTileCols), unsigned((rows + kTileRows - 1) / kTileRows));
}

}  // namespace

void fp8_row_amax(const void* x, DType dtype, int64_t rows, int64_t cols, float* amax,
                  stream_t stream) {
  FSDP_CHECK(rows < (int64_t(1) << 31), ValueError, "fp8_row_amax: ", rows, " rows are too many");
  if (rows == 0) return;
  if (cols == 0) {
    FSDP_CALL(cudaMemsetAsync(amax, 0, size_t(rows) * sizeof(float), stream));
    return;
  }
  dispatch_16_32(dtype, "fp8_row_amax", [&](auto tag) {
    using T = decltype(tag);
    row_amax_kernel<T><<<unsigned(rows), kThreads, 0, stream>>>(static_cast<const T*>(x), cols, amax);
  });
  FSDP_CHECK_LAUNCH();
}

void fp8_column_amax(const void* x, DType dtype, int64_t rows, int64_t cols, float* amax,
                     stream_t stream) {
  if (cols == 0) return;
  FSDP_CALL(cudaMemsetAsync(amax, 0, size_t(cols) * sizeof(float), stream));
  if (rows == 0) return;
  const dim3 grid = tile_grid(rows, cols, "fp8_column_amax");
  dispatch_16_32(dtype, "fp8_column_amax", [&](auto tag) {
    using T = decltype(tag);
    column_amax_kernel<T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), rows, cols,
                                                         reinterpret_cast<unsigned*>(amax));
  });
  FSDP_CHECK_LAUNCH();
}

int64_t fp8_rowwise_column_sum_tiles(int64_t rows) { return (rows + kTileRows - 1) / kTileRows; }

void fp8_quantize_rowwise(const void* x, DType dtype, int64_t rows, int64_t cols, Fp8Format format,
                          const float* row_amax, uint8_t* q, float* q_scale_inv,
                          const float* column_amax, uint8_t* qt, float* qt_scale_inv,
                          float* partials, stream_t stream) {
  const dim3 grid = tile_grid(rows, cols, "fp8_quantize_rowwise");
  // The inverse scales, with the bits of the scales the kernel multiplies by.
  if (q) fp8_scale_inverses(row_amax, rows, format, q_scale_inv, stream);
  if (qt) fp8_scale_inverses(column_amax, cols, format, qt_scale_inv, stream);
  // Whole 8-element groups: rows of x start 16-byte aligned, those of q and qt 8-byte.
  const bool vec = cols % 8 == 0 && aligned16(x) && uintptr_t(q) % 8 == 0 && uintptr_t(qt) % 8 == 0;
  dispatch_16_32(dtype, "fp8_quantize_rowwise", [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto vec_tag, auto sums_tag) {
      quantize_rowwise_kernel<T, decltype(vec_tag)::value, decltype(sums_tag)::value>
          <<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), rows, cols, format, row_amax,
                                          q, column_amax, qt, partials);
    };
    using yes = std::true_type;
    using no = std::false_type;
    if (vec && partials) launch(yes{}, yes{});
    else if (vec) launch(yes{}, no{});
    else if (partials) launch(no{}, yes{});
    else launch(no{}, no{});
  });
  FSDP_CHECK_LAUNCH();
}

}  // namespace fsdp::kernels::cuda
