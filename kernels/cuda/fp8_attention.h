// The scales of an FP8 attention on the device (kernels/fp8_attention.h's rules), so the
// quantized inputs and cuDNN's FP8 graphs never wait on the host. The twin of
// kernels/cpu/fp8_attention.h's fp8_attention_scales.
#pragma once

#include <cstdint>

#include "kernels/cuda/basic.h"
#include "kernels/fp8_attention.h"

namespace fsdp::kernels::cuda {

// scales (kFp8ScalarCount) f32 = fp8_attention_scales of the amaxes (f32 scalars on the
// device); amax_dout null: the forward's slots only.
void fp8_attention_scales(float* scales, const float* amax_q, const float* amax_k,
                          const float* amax_v, const float* amax_dout, int64_t head_dim,
                          int64_t keys, float softmax_scale, Fp8AttentionTypes types,
                          stream_t stream);

}  // namespace fsdp::kernels::cuda
