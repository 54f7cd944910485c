// Device helpers of the transformer kernels: 128-bit packed loads and stores of 16-bit and
// 32-bit element types, element-width dispatch, and warp reductions.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace fsdp::kernels::cuda {

// 16 bytes of T: 8 bf16 or 4 floats. Loaded and stored with one 128-bit instruction.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) {
  Pack<T> r;
  *reinterpret_cast<int4*>(&r) = *reinterpret_cast<const int4*>(p);
  return r;
}

template <typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& r) {
  *reinterpret_cast<int4*>(p) = *reinterpret_cast<const int4*>(&r);
}

// Reads W consecutive elements (W = 1 or Pack<T>::kSize) into floats.
template <int W, typename T>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[W]) {
  if constexpr (W == 1) {
    out[0] = to_float(p[0]);
  } else {
    const Pack<T> r = load_pack(p);
#pragma unroll
    for (int i = 0; i < W; ++i) out[i] = to_float(r.v[i]);
  }
}

// Writes W floats to W consecutive elements, rounding once.
template <int W, typename T>
__device__ __forceinline__ void store_floats(T* p, const float (&in)[W]) {
  if constexpr (W == 1) {
    p[0] = from_float<T>(in[0]);
  } else {
    Pack<T> r;
#pragma unroll
    for (int i = 0; i < W; ++i) r.v[i] = from_float<T>(in[i]);
    store_pack(p, r);
  }
}

inline bool aligned16(const void* p) { return p == nullptr || (uintptr_t(p) & 15) == 0; }

// Calls f(std::integral_constant<int, W>) with W = Pack<T>::kSize when every pointer is
// 16-byte aligned and `count` (the row length) is a multiple of it, W = 1 otherwise.
template <typename T, typename F>
void dispatch_width(int64_t count, std::initializer_list<const void*> ptrs, F&& f) {
  constexpr int kW = Pack<T>::kSize;
  bool ok = count % kW == 0;
  for (const void* p : ptrs) ok = ok && aligned16(p);
  if (ok)
    f(std::integral_constant<int, kW>{});
  else
    f(std::integral_constant<int, 1>{});
}

// bf16 or f32 compute dtypes: f(bf16_t{}) or f(float{}).
template <typename F>
void dispatch_compute(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::bf16: f(bf16_t{}); return;
    case DType::f32: f(float{}); return;
    default: FSDP_THROW(DTypeError, what, ": CUDA computes in bf16 or f32, got ", dtype_name(t));
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

constexpr int kWarp = 32;

}  // namespace fsdp::kernels::cuda
