#include "kernels/cuda/fp8_rows.h"

#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/fp8_tile.cuh"

namespace fsdp::kernels::cuda {
namespace {

namespace tile = fp8_tile;
constexpr int kThreads = tile::kThreads;

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
  __shared__ float part[tile::kRowGroups][tile::kCols];
  const int64_t r0 = tile::first_row(), c0 = tile::first_col();
  const int col8 = (threadIdx.x % 16) * 8, sub = threadIdx.x / 16;
  float m[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int rr = sub; rr < tile::kRows && r0 + rr < rows; rr += tile::kRowGroups) {
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
  if (threadIdx.x < tile::kCols && c0 + threadIdx.x < cols) {
    float t = 0.0f;
    for (int g = 0; g < tile::kRowGroups; ++g) t = fmaxf(t, part[g][threadIdx.x]);
    atomicMax(amax_bits + c0 + threadIdx.x, __float_as_uint(t));
  }
}

// q and qt of one tile (kernels/cuda/fp8_tile.cuh), q's bytes scaled by their row's scale
// and qt's by their column's; with kSums the tile's column sums of x go to partials.
template <typename T, bool kVec, bool kSums>
__global__ void quantize_rowwise_kernel(const T* x, int64_t rows, int64_t cols, Fp8Format format,
                                        const float* row_amax, uint8_t* q,
                                        const float* column_amax, uint8_t* qt, float* partials) {
  __shared__ __align__(8) tile::Bytes bytes;
  __shared__ float sums[kSums ? tile::kRowGroups : 1][kSums ? tile::kCols : 1];
  const int64_t r0 = tile::first_row(), c0 = tile::first_col();
  const int col8 = (threadIdx.x % 16) * 8, sub = threadIdx.x / 16;
  float column_scale[8], acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int64_t c = c0 + col8 + j;
    column_scale[j] = qt && c < cols ? fp8_scale_for_amax(column_amax[c], format) : 1.0f;
  }
  for (int rr = sub; rr < tile::kRows; rr += tile::kRowGroups) {
    const int64_t r = r0 + rr, c = c0 + col8;
    if (r >= rows) break;
    float v[8];
    tile::load8<kVec>(x, r, c, cols, v);
    if (kSums) {
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += v[j];
    }
    uint8_t b[8];
    if (qt) {
#pragma unroll
      for (int j = 0; j < 8; ++j) b[j] = fp8_encode_satfinite(__fmul_rn(v[j], column_scale[j]), format);
      *reinterpret_cast<uint2*>(&bytes[rr][col8]) = fp8_pack8(b);
    }
    if (!q) continue;
    const float row_scale = fp8_scale_for_amax(row_amax[r], format);
#pragma unroll
    for (int j = 0; j < 8; ++j) b[j] = fp8_encode_satfinite(__fmul_rn(v[j], row_scale), format);
    tile::store8<kVec>(q, r, c, cols, b);
  }
  if constexpr (kSums) tile::column_sums(sums, acc, sub, col8, cols, partials);
  if (qt) tile::store_transposed<kVec>(bytes, qt, rows, cols);
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
  tile::dispatch_cast_input(dtype, "fp8_row_amax", [&](auto tag) {
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
  const dim3 grid = tile::grid(rows, cols, "fp8_column_amax");
  tile::dispatch_cast_input(dtype, "fp8_column_amax", [&](auto tag) {
    using T = decltype(tag);
    column_amax_kernel<T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), rows, cols,
                                                         reinterpret_cast<unsigned*>(amax));
  });
  FSDP_CHECK_LAUNCH();
}

void fp8_quantize_rowwise(const void* x, DType dtype, int64_t rows, int64_t cols, Fp8Format format,
                          const float* row_amax, uint8_t* q, float* q_scale_inv,
                          const float* column_amax, uint8_t* qt, float* qt_scale_inv,
                          const ColumnSums& column_sums, stream_t stream) {
  float* partials = column_sums.out ? column_sums.partials : nullptr;
  const dim3 grid = tile::grid(rows, cols, "fp8_quantize_rowwise");
  // The inverse scales, with the bits of the scales the kernel multiplies by.
  if (q) fp8_scale_inverses(row_amax, rows, format, q_scale_inv, stream);
  if (qt) fp8_scale_inverses(column_amax, cols, format, qt_scale_inv, stream);
  // Whole 8-element groups: rows of x start 16-byte aligned, those of q and qt 8-byte.
  const bool vec = cols % 8 == 0 && aligned16(x) && uintptr_t(q) % 8 == 0 && uintptr_t(qt) % 8 == 0;
  tile::dispatch_cast_input(dtype, "fp8_quantize_rowwise", [&](auto tag) {
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
  if (partials)
    finish_column_sums(partials, fp8_column_sum_tiles(rows), cols, column_sums.out,
                       column_sums.out_dtype, true, stream);
}

}  // namespace fsdp::kernels::cuda
