// Per-tensor ("tensorwise") FP8 scaling, written once for the CPU and CUDA kernels.
//
// A tensor quantized to FP8 carries its scaling state in three f32 on its device, its
// "scales": the largest magnitude of the tensor (amax), the factor its values are multiplied
// by before the cast to FP8 (scale), and that factor's inverse, which the FP8 matmul
// multiplies its product by to undo it (scale_inv). Current scaling takes amax from the
// tensor being quantized, so the largest value lands on the format's largest finite value.
#pragma once

#include <cfloat>

#include "kernels/host_device.h"

namespace fsdp::kernels {

// Offsets into a scales buffer of kFp8Scales f32.
constexpr int kFp8Amax = 0;
constexpr int kFp8Scale = 1;
constexpr int kFp8ScaleInv = 2;
constexpr int kFp8Scales = 3;

// scale = fp8_max / amax, with Transformer Engine's guards: an amax of 0 (an all-zero
// tensor), infinity or NaN gives scale 1 (nothing to map, or nothing a finite scale could
// map: infinities saturate), and a quotient past float's range (amax below
// fp8_max / FLT_MAX) gives FLT_MAX. One IEEE division, rounded the same on both backends.
FSDP_HD float fp8_scale_from_amax(float amax, float fp8_max) {
  if (!(amax > 0.0f) || amax > FLT_MAX) return 1.0f;  // 0, NaN (fails the test) or inf
  const float s = fp8_max / amax;
  return s > FLT_MAX ? FLT_MAX : s;
}

}  // namespace fsdp::kernels
