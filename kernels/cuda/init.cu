// The counter-based initializers on CUDA (kernels/cuda/init.h).
#include "kernels/cuda/init.h"

#include "kernels/cuda/vec.cuh"
#include "kernels/philox.h"

namespace fsdp::kernels::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void init_normal_kernel(T* out, int64_t n, uint64_t seed, uint64_t key, int64_t offset,
                                   double mean, double std) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_double_dev<T>(random_normal(seed, key, uint64_t(offset + i), mean, std));
}

template <typename T>
__global__ void init_uniform_kernel(T* out, int64_t n, uint64_t seed, uint64_t key,
                                    int64_t offset, double low, double high) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_double_dev<T>(random_uniform(seed, key, uint64_t(offset + i), low, high));
}

}  // namespace

void init_normal(void* out, DType dtype, int64_t n, uint64_t seed, uint64_t key, int64_t offset,
                 double mean, double std, stream_t stream) {
  if (n == 0) return;
  dispatch_device_floating(dtype, "init_normal", [&](auto tag) {
    using T = decltype(tag);
    init_normal_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(out), n, seed, key, offset, mean, std);
    FSDP_CHECK_LAUNCH();
  });
}

void init_uniform(void* out, DType dtype, int64_t n, uint64_t seed, uint64_t key, int64_t offset,
                  double low, double high, stream_t stream) {
  if (n == 0) return;
  dispatch_device_floating(dtype, "init_uniform", [&](auto tag) {
    using T = decltype(tag);
    init_uniform_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(out), n, seed, key, offset, low, high);
    FSDP_CHECK_LAUNCH();
  });
}

}  // namespace fsdp::kernels::cuda
