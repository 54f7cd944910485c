// Fused AdamW on CUDA (kernels/cuda/adamw.h).
#include "kernels/cuda/adamw.h"

#include "kernels/cuda/vec.cuh"

namespace fsdp::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// P: parameter (f32), G: gradient, M: moments, C: parameter copy (void when absent).
template <typename G, typename M, typename C>
__global__ void adamw_kernel(float* param, const G* grad, M* exp_avg, M* exp_avg_sq, C* copy,
                             int64_t n, AdamWScalars s) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float p = param[i], m = to_float(exp_avg[i]), v = to_float(exp_avg_sq[i]);
    adamw_update(p, m, v, to_float(grad[i]), s);
    param[i] = p;
    exp_avg[i] = from_float<M>(m);
    exp_avg_sq[i] = from_float<M>(v);
    if constexpr (!std::is_void_v<C>) copy[i] = from_float<C>(p);
  }
}

}  // namespace

void adamw_step(const AdamWBuffers& buf, int64_t n, const AdamWScalars& s, stream_t stream) {
  if (n == 0) return;
  FSDP_CHECK(buf.param_dtype == DType::f32, DTypeError,
             "adamw_step: CUDA updates f32 master parameters, got ", dtype_name(buf.param_dtype));
  float* p = static_cast<float*>(buf.param);
  dispatch_compute(buf.grad_dtype, "adamw_step gradient", [&](auto gtag) {
    using G = decltype(gtag);
    dispatch_compute(buf.moment_dtype, "adamw_step moments", [&](auto mtag) {
      using M = decltype(mtag);
      const G* g = static_cast<const G*>(buf.grad);
      M* m = static_cast<M*>(buf.exp_avg);
      M* v = static_cast<M*>(buf.exp_avg_sq);
      const unsigned blocks = grid_for(n, kThreads);
      if (!buf.param_copy) {
        adamw_kernel<G, M, void><<<blocks, kThreads, 0, stream>>>(p, g, m, v, nullptr, n, s);
        FSDP_CHECK_LAUNCH();
        return;
      }
      dispatch_compute(buf.copy_dtype, "adamw_step parameter copy", [&](auto ctag) {
        using C = decltype(ctag);
        adamw_kernel<G, M, C><<<blocks, kThreads, 0, stream>>>(
            p, g, m, v, static_cast<C*>(buf.param_copy), n, s);
        FSDP_CHECK_LAUNCH();
      });
    });
  });
}

}  // namespace fsdp::kernels::cuda
