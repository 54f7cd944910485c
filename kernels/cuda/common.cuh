// Shared pieces of the CUDA kernels: dtype dispatch to device element types, conversions
// that round exactly like the CPU reference, launch checking, and block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/core/cuda_check.h"
#include "runtime/core/dtype.h"
#include "runtime/core/error.h"

namespace fsdp::kernels::cuda {

// Checks the launch just made (configuration errors surface here; faults surface at the next
// synchronizing call, which is checked too).
#define FSDP_CHECK_LAUNCH() FSDP_CALL(cudaGetLastError())

using bf16_t = __nv_bfloat16;
using f16_t = __half;

// Floating conversions; float is the compute type of every 16-bit type.
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(double v) { return float(v); }
__device__ __forceinline__ float to_float(bf16_t v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(f16_t v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ double from_float<double>(float v) { return v; }
template <> __device__ __forceinline__ bf16_t from_float<bf16_t>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ f16_t from_float<f16_t>(float v) { return __float2half_rn(v); }

// Any element type through double, as the CPU's convert(): doubles narrow to float first,
// then to 16 bits, exactly as the host does.
template <typename T> __device__ __forceinline__ double to_double_dev(T v) { return double(v); }
template <> __device__ __forceinline__ double to_double_dev(bf16_t v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ double to_double_dev(f16_t v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_double_dev(double v) { return T(v); }
template <> __device__ __forceinline__ bf16_t from_double_dev<bf16_t>(double v) {
  return __float2bfloat16_rn(float(v));
}
template <> __device__ __forceinline__ f16_t from_double_dev<f16_t>(double v) {
  return __float2half_rn(float(v));
}

// The compute type of an element type: double for double, float otherwise.
template <typename T> struct ComputeOf { using type = float; };
template <> struct ComputeOf<double> { using type = double; };

template <typename F>
void dispatch_device_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    case DType::bf16: f(bf16_t{}); return;
    case DType::f16: f(f16_t{}); return;
    case DType::i64: f(int64_t{}); return;
    case DType::i32: f(int32_t{}); return;
    case DType::u16: f(uint16_t{}); return;
    case DType::u8: f(uint8_t{}); return;
  }
}

template <typename F>
void dispatch_device_floating(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    case DType::bf16: f(bf16_t{}); return;
    case DType::f16: f(f16_t{}); return;
    default: FSDP_THROW(DTypeError, what, ": floating dtype expected, got ", dtype_name(t));
  }
}

inline unsigned grid_for(int64_t n, int block, int max_blocks = 65535 * 8) {
  int64_t g = (n + block - 1) / block;
  if (g > max_blocks) g = max_blocks;
  return unsigned(g < 1 ? 1 : g);
}

// Sum of `v` over the block (blockDim.x a multiple of 32, at most 1024). All threads get it.
template <typename T>
__device__ __forceinline__ T block_sum(T v) {
  __shared__ T shared[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int nwarps = (blockDim.x + 31) >> 5;
  v = lane < nwarps ? shared[lane] : T(0);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__device__ __forceinline__ T block_max(T v) {
  __shared__ T shared[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int nwarps = (blockDim.x + 31) >> 5;
  v = lane < nwarps ? shared[lane] : T(-INFINITY);
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace fsdp::kernels::cuda
