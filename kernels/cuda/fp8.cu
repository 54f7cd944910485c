#include "kernels/cuda/fp8.h"

#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_encode.cuh"
#include "kernels/cuda/vec.cuh"

namespace fsdp::kernels::cuda {
namespace {

// Each thread folds W elements at a time (W = 1, or one 128-bit pack), then the block's
// maximum goes into *amax_bits with an integer atomicMax: for non-negative floats the bit
// patterns order as the values do, so the result does not depend on the order.
template <typename T, int W>
__global__ void amax_kernel(const T* x, int64_t n, unsigned* amax_bits) {
  float m = 0.0f;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * W;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * W; i < n; i += stride) {
    float v[W];
    load_floats<W>(x + i, v);
#pragma unroll
    for (int j = 0; j < W; ++j) m = fmaxf(m, fabsf(v[j]));
  }
  m = block_max(m);
  if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(m));
}

constexpr int kTileRows = 64, kTileCols = 128;  // a block quantizes a (64, 128) tile
constexpr int kThreads = 256;

// q and qt of one (64, 128) tile. Each thread converts 8 consecutive columns of a row (one
// 128-bit load of bf16 and one 64-bit store into q when kVec: rows 16-byte aligned), keeps
// the bytes in shared memory, and then writes 8 consecutive rows of a column of qt (one
// 64-bit store): both global writes are coalesced, and each element is read once. With
// kSums, the tile's column sums of x (unscaled) go to partials (row tile, cols), summed in a
// fixed order (a bias gradient from the same read: finish_column_sums adds the tiles).
template <typename T, bool kVec, bool kSums>
__global__ void quantize_kernel(const T* x, int64_t rows, int64_t cols, const float* amax,
                                Fp8Format format, uint8_t* q, uint8_t* qt, float* scale_inv,
                                float* partials, unsigned* record_amax_bits) {
  __shared__ __align__(8) uint8_t tile[kTileRows][kTileCols + 8];
  __shared__ float sums[kSums ? kThreads / 16 : 1][kSums ? kTileCols : 1];
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float seen = 0.0f;  // max |x| over this thread's elements (record_amax_bits)
  const float scale = fp8_scale_for_amax(*amax, format);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *scale_inv = __frcp_rn(scale);
  const int64_t r0 = int64_t(blockIdx.y) * kTileRows, c0 = int64_t(blockIdx.x) * kTileCols;
  const int col8 = (threadIdx.x % 16) * 8, sub = threadIdx.x / 16;  // 16 rows per pass
  for (int rr = sub; rr < kTileRows; rr += kThreads / 16) {
    const int64_t r = r0 + rr, c = c0 + col8;
    if (r >= rows) break;
    float v[8];
    if (kVec && c + 7 < cols) {
      load_floats<8>(x + r * cols + c, v);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = c + j < cols ? to_float(x[r * cols + c + j]) : 0.0f;
    }
    uint8_t b[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      b[j] = fp8_encode_satfinite(__fmul_rn(v[j], scale), format);
      if (kSums) acc[j] += v[j];
      seen = fmaxf(seen, fabsf(v[j]));
    }
    *reinterpret_cast<uint2*>(&tile[rr][col8]) = fp8_pack8(b);
    if (!q) continue;
    if (kVec && c + 7 < cols) {
      *reinterpret_cast<uint2*>(q + r * cols + c) = fp8_pack8(b);
    } else {
      for (int j = 0; j < 8 && c + j < cols; ++j) q[r * cols + c + j] = b[j];
    }
  }
  if (record_amax_bits) {  // the same for the whole block
    seen = block_max(seen);
    if (threadIdx.x == 0) atomicMax(record_amax_bits, __float_as_uint(seen));
  }
  if (kSums) {
#pragma unroll
    for (int j = 0; j < 8; ++j) sums[sub][col8 + j] = acc[j];
    __syncthreads();
    if (threadIdx.x < kTileCols && c0 + threadIdx.x < cols) {
      float total = 0.0f;
      for (int g = 0; g < kThreads / 16; ++g) total += sums[g][threadIdx.x];
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

__global__ void scalars_kernel(float* alpha_beta, const float* sa, const float* sb, float alpha,
                               float beta) {
  alpha_beta[0] = __fmul_rn(alpha, __fmul_rn(*sa, *sb));
  alpha_beta[1] = beta;
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

}  // namespace

int compute_capability(int device) {
  int major = 0, minor = 0;
  FSDP_CALL(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  FSDP_CALL(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

void fp8_amax(float* amax, const void* x, DType dtype, int64_t n, stream_t stream) {
  FSDP_CALL(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  if (n == 0) return;
  dispatch_16_32(dtype, "fp8_amax", [&](auto tag) {
    using T = decltype(tag);
    dispatch_width<T>(n, {x}, [&](auto width) {
      constexpr int W = decltype(width)::value;
      const int64_t blocks = std::min<int64_t>((n / W + 255) / 256, 2048);
      amax_kernel<T, W><<<unsigned(blocks), 256, 0, stream>>>(
          static_cast<const T*>(x), n, reinterpret_cast<unsigned*>(amax));
    });
  });
  FSDP_CHECK_LAUNCH();
}

int64_t fp8_column_sum_tiles(int64_t rows) { return (rows + kTileRows - 1) / kTileRows; }

void fp8_quantize(const void* x, DType dtype, int64_t rows, int64_t cols, const float* amax,
                  Fp8Format format, uint8_t* q, uint8_t* qt, float* scale_inv, float* partials,
                  float* record_amax, stream_t stream) {
  FSDP_CHECK(rows > 0 && cols > 0 && (rows + kTileRows - 1) / kTileRows < 65536, ValueError,
             "fp8_quantize: (", rows, ", ", cols, ") is empty or has too many rows");
  const dim3 grid(unsigned((cols + kTileCols - 1) / kTileCols),
                  unsigned((rows + kTileRows - 1) / kTileRows));
  // Whole 8-element groups: rows of x start 16-byte aligned, those of q and qt 8-byte.
  const bool vec = cols % 8 == 0 && aligned16(x) && uintptr_t(q) % 8 == 0 && uintptr_t(qt) % 8 == 0;
  dispatch_16_32(dtype, "fp8_quantize", [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto vec_tag, auto sums_tag) {
      quantize_kernel<T, decltype(vec_tag)::value, decltype(sums_tag)::value>
          <<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), rows, cols, amax, format, q,
                                          qt, scale_inv, partials,
                                          reinterpret_cast<unsigned*>(record_amax));
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

namespace {

// One thread per (layer, operand): fp8_update_amax_history on its strided history.
__global__ void update_histories_kernel(float* history, const float* step_amax, float* scale_amax,
                                        int64_t layers, int64_t len, int64_t width, bool roll,
                                        bool use_max, float margin_factor) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= layers * width) return;
  const int64_t l = i / width, o = i % width;
  scale_amax[i] = fp8_update_amax_history(history + l * len * width + o, len, width, step_amax[i],
                                          roll, use_max, margin_factor);
}

__global__ void scale_inverses_kernel(const float* amax, int64_t n, Fp8Format format,
                                      float* scale_inv) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) scale_inv[i] = __frcp_rn(fp8_scale_for_amax(amax[i], format));
}

}  // namespace

void fp8_scale_inverses(const float* amax, int64_t n, Fp8Format format, float* scale_inv,
                        stream_t stream) {
  if (n == 0) return;
  scale_inverses_kernel<<<unsigned((n + 127) / 128), 128, 0, stream>>>(amax, n, format, scale_inv);
  FSDP_CHECK_LAUNCH();
}

void fp8_update_amax_histories(float* history, const float* step_amax, float* scale_amax,
                               int64_t layers, int64_t len, int64_t width, bool roll,
                               bool use_max, float margin_factor, stream_t stream) {
  const int64_t n = layers * width;
  if (n == 0) return;
  update_histories_kernel<<<unsigned((n + 127) / 128), 128, 0, stream>>>(
      history, step_amax, scale_amax, layers, len, width, roll, use_max, margin_factor);
  FSDP_CHECK_LAUNCH();
}

void fp8_matmul_scalars(float* alpha_beta, const float* scale_inv_a, const float* scale_inv_b,
                        float alpha, float beta, stream_t stream) {
  scalars_kernel<<<1, 1, 0, stream>>>(alpha_beta, scale_inv_a, scale_inv_b, alpha, beta);
  FSDP_CHECK_LAUNCH();
}

}  // namespace fsdp::kernels::cuda
