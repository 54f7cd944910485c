// Device helpers of the transformer kernels: 128-bit packed loads and stores of 16-bit and
// 32-bit element types, element-width dispatch, and warp reductions.
#pragma once

#include <cstdint>
#include <type_traits>

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

// W consecutive elements as whole packs (W a multiple of Pack<T>::kSize), loaded now and
// converted later by unpack_floats: a kernel can issue all its loads before any arithmetic.
template <int W, typename T>
struct Packs {
  static_assert(W % Pack<T>::kSize == 0, "W must be a whole number of packs");
  Pack<T> p[W / Pack<T>::kSize];
};

template <int W, typename T>
__device__ __forceinline__ Packs<W, T> load_packs(const T* p) {
  Packs<W, T> r;
#pragma unroll
  for (int k = 0; k < W / Pack<T>::kSize; ++k) r.p[k] = load_pack(p + k * Pack<T>::kSize);
  return r;
}

template <int W, typename T>
__device__ __forceinline__ void unpack_floats(const Packs<W, T>& r, float (&out)[W]) {
  constexpr int kS = Pack<T>::kSize;
#pragma unroll
  for (int k = 0; k < W / kS; ++k)
#pragma unroll
    for (int i = 0; i < kS; ++i) out[k * kS + i] = to_float(r.p[k].v[i]);
}

// Reads W consecutive elements into floats: W = 1, or a multiple of Pack<T>::kSize (one
// 128-bit load per pack, so 8 floats for an f32 row read beside a bf16 one).
template <int W, typename T>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[W]) {
  if constexpr (W == 1) {
    out[0] = to_float(p[0]);
  } else {
    constexpr int kS = Pack<T>::kSize;
    static_assert(W % kS == 0, "W must be a whole number of packs");
#pragma unroll
    for (int k = 0; k < W / kS; ++k) {
      const Pack<T> r = load_pack(p + k * kS);
#pragma unroll
      for (int i = 0; i < kS; ++i) out[k * kS + i] = to_float(r.v[i]);
    }
  }
}

// Writes W floats to W consecutive elements, rounding once.
template <int W, typename T>
__device__ __forceinline__ void store_floats(T* p, const float (&in)[W]) {
  if constexpr (W == 1) {
    p[0] = from_float<T>(in[0]);
  } else {
    constexpr int kS = Pack<T>::kSize;
    static_assert(W % kS == 0, "W must be a whole number of packs");
#pragma unroll
    for (int k = 0; k < W / kS; ++k) {
      Pack<T> r;
#pragma unroll
      for (int i = 0; i < kS; ++i) r.v[i] = from_float<T>(in[k * kS + i]);
      store_pack(p + k * kS, r);
    }
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

// The element type of a residual-stream tensor read or written beside data of the compute
// type T (bf16_t or float, from dispatch_compute): T itself, or float beside bf16 (an f32
// residual stream). Calls f(T{}) or f(float{}).
template <typename T, typename F>
void dispatch_residual(DType t, const char* what, F&& f) {
  constexpr bool kBf16 = std::is_same_v<T, bf16_t>;
  const DType self = kBf16 ? DType::bf16 : DType::f32;
  if (t == self) {
    f(T{});
  } else if (kBf16 && t == DType::f32) {
    f(float{});
  } else {
    FSDP_THROW(DTypeError, what, ": a residual stream of ", dtype_name(t), " beside ",
               dtype_name(self), " data (only the same dtype, or f32 beside bf16)");
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
