// What the FP8 cast kernels share: the device's FP8 conversion, fp8(v) rounded to nearest
// even and saturated to the format's largest finite value (kernels/fp8_format.h's
// fp8_encode is its host twin), one value or two at a time, and the packing of 8 bytes
// for one 64-bit store.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/fp8_format.h"

namespace fsdp::kernels::cuda {

__device__ __forceinline__ uint8_t fp8_encode_satfinite(float v, Fp8Format f) {
  return f == Fp8Format::e4m3 ? __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3)
                              : __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
}

// fp8(a) | fp8(b) << 8, each byte as fp8_encode_satfinite gives it (the same conversion
// instruction, both of its lanes used).
__device__ __forceinline__ uint32_t fp8_encode2_satfinite(float a, float b, Fp8Format f) {
  const float2 v = make_float2(a, b);
  return f == Fp8Format::e4m3 ? __nv_cvt_float2_to_fp8x2(v, __NV_SATFINITE, __NV_E4M3)
                              : __nv_cvt_float2_to_fp8x2(v, __NV_SATFINITE, __NV_E5M2);
}

__device__ __forceinline__ uint2 fp8_pack8(const uint8_t (&b)[8]) {
  return make_uint2(uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24,
                    uint32_t(b[4]) | uint32_t(b[5]) << 8 | uint32_t(b[6]) << 16 | uint32_t(b[7]) << 24);
}

}  // namespace fsdp::kernels::cuda
