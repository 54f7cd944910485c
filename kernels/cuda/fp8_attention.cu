#include "kernels/cuda/fp8_attention.h"

#include "kernels/cuda/common.cuh"

namespace fsdp::kernels::cuda {
namespace {

__global__ void attention_scales_kernel(float* scales, const float* amax_q, const float* amax_k,
                                        const float* amax_v, const float* amax_dout,
                                        int64_t head_dim, int64_t keys, float softmax_scale,
                                        Fp8AttentionTypes types) {
  kernels::fp8_attention_scales(scales, *amax_q, *amax_k, *amax_v, amax_dout ? *amax_dout : -1.0f,
                                head_dim, keys, softmax_scale, types);
}

}  // namespace

void fp8_attention_scales(float* scales, const float* amax_q, const float* amax_k,
                          const float* amax_v, const float* amax_dout, int64_t head_dim,
                          int64_t keys, float softmax_scale, Fp8AttentionTypes types,
                          stream_t stream) {
  attention_scales_kernel<<<1, 1, 0, stream>>>(scales, amax_q, amax_k, amax_v, amax_dout,
                                               head_dim, keys, softmax_scale, types);
  FSDP_CHECK_LAUNCH();
}

}  // namespace fsdp::kernels::cuda
