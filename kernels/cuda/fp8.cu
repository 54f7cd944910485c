#include "kernels/cuda/fp8.h"

#include <cuda_fp8.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vec.cuh"

namespace fsdp::kernels::cuda {
namespace {

__device__ __forceinline__ uint8_t encode(float v, Fp8Format f) {
  return f == Fp8Format::e4m3 ? __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3)
                              : __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
}

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

constexpr int kTile = 64;     // a block quantizes a (64, 64) tile
constexpr int kThreads = 256;  // 16 threads per tile row, 4 columns each

// q and qt of one (64, 64) tile. Each thread converts 4 consecutive columns of a row (one
// 32-bit store into q), keeps the bytes in shared memory, and then writes 4 consecutive
// rows of a column of qt (one 32-bit store): both global writes are coalesced.
template <typename T>
__global__ void quantize_kernel(const T* x, int64_t rows, int64_t cols, const float* amax,
                                Fp8Format format, uint8_t* q, uint8_t* qt, float* scale_inv) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const float scale = fp8_scale_for_amax(*amax, format);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *scale_inv = __frcp_rn(scale);
  const int64_t r0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
  const int lane4 = (threadIdx.x % 16) * 4, sub = threadIdx.x / 16;
  const bool vec_q = cols % 4 == 0, vec_qt = rows % 4 == 0;
  for (int rr = sub; rr < kTile; rr += kThreads / 16) {
    const int64_t r = r0 + rr;
    if (r >= rows) break;
    uint8_t b[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t c = c0 + lane4 + j;
      b[j] = c < cols ? encode(__fmul_rn(to_float(x[r * cols + c]), scale), format) : 0;
      tile[rr][lane4 + j] = b[j];
    }
    if (!q) continue;
    const int64_t c = c0 + lane4;
    if (vec_q && c + 3 < cols) {
      *reinterpret_cast<uint32_t*>(q + r * cols + c) =
          uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
    } else {
      for (int j = 0; j < 4 && c + j < cols; ++j) q[r * cols + c + j] = b[j];
    }
  }
  if (!qt) return;
  __syncthreads();
  for (int cc = sub; cc < kTile; cc += kThreads / 16) {
    const int64_t c = c0 + cc;
    if (c >= cols) break;
    const int64_t r = r0 + lane4;
    if (r >= rows) continue;
    if (vec_qt && r + 3 < rows) {
      *reinterpret_cast<uint32_t*>(qt + c * rows + r) =
          uint32_t(tile[lane4][cc]) | uint32_t(tile[lane4 + 1][cc]) << 8 |
          uint32_t(tile[lane4 + 2][cc]) << 16 | uint32_t(tile[lane4 + 3][cc]) << 24;
    } else {
      for (int j = 0; j < 4 && r + j < rows; ++j) qt[c * rows + r + j] = tile[lane4 + j][cc];
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

void fp8_quantize(const void* x, DType dtype, int64_t rows, int64_t cols, const float* amax,
                  Fp8Format format, uint8_t* q, uint8_t* qt, float* scale_inv, stream_t stream) {
  FSDP_CHECK(rows > 0 && cols > 0 && (rows + kTile - 1) / kTile < 65536, ValueError,
             "fp8_quantize: (", rows, ", ", cols, ") is empty or has too many rows");
  FSDP_CHECK((q == nullptr || uintptr_t(q) % 4 == 0) && (qt == nullptr || uintptr_t(qt) % 4 == 0),
             ValueError, "fp8_quantize: outputs must be 4-byte aligned");
  const dim3 grid(unsigned((cols + kTile - 1) / kTile), unsigned((rows + kTile - 1) / kTile));
  dispatch_16_32(dtype, "fp8_quantize", [&](auto tag) {
    using T = decltype(tag);
    quantize_kernel<T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), rows, cols, amax,
                                                      format, q, qt, scale_inv);
  });
  FSDP_CHECK_LAUNCH();
}

void fp8_matmul_scalars(float* alpha_beta, const float* scale_inv_a, const float* scale_inv_b,
                        float alpha, float beta, stream_t stream) {
  scalars_kernel<<<1, 1, 0, stream>>>(alpha_beta, scale_inv_a, scale_inv_b, alpha, beta);
  FSDP_CHECK_LAUNCH();
}

}  // namespace fsdp::kernels::cuda
