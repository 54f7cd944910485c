// AdamW computed in f32 on the host: the CPU-offloaded optimizer's update.
//
// The same formula and roundings as the CUDA kernel (adamw_update<float>, scalar_math.h),
// in loops the compiler vectorizes, so offloading the optimizer does not change its
// numerics and the host's cores run at memory speed. (The reference kernel, adamw_step in
// adamw.h, computes in double: it is the model the others are tested against.)
#pragma once

#include <cstdint>

#include "kernels/nn_shapes.h"
#include "kernels/scalar_math.h"

namespace fsdp::kernels::cpu {

// n contiguous elements: param f32; grad f32 or bf16; moments f32 or bf16; param_copy
// (optional) f32 or bf16. Other dtypes throw DTypeError.
void adamw_step_f32(const AdamWBuffers& buf, int64_t n, const AdamWScalars& s);

}  // namespace fsdp::kernels::cpu
