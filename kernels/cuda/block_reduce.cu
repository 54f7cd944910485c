#include "kernels/cuda/block_reduce.h"

#include "kernels/cuda/common.cuh"

namespace fsdp::kernels::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T, typename A>
__global__ void block_sum_squares_kernel(const T* x, int64_t block, A* out) {
  const T* p = x + blockIdx.x * block;
  A acc = 0;
  for (int64_t i = threadIdx.x; i < block; i += kThreads) {
    const A v = A(to_double_dev(p[i]));
    acc += v * v;
  }
  __shared__ A shared[kThreads];
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = shared[0];
}

}  // namespace

void block_sum_squares(const void* x, DType dtype, int64_t nblocks, int64_t block, void* out,
                       CUstream_st* stream) {
  dispatch_device_floating(dtype, "block_sum_squares", [&](auto tag) {
    using T = decltype(tag);
    using A = typename ComputeOf<T>::type;
    block_sum_squares_kernel<T, A><<<unsigned(nblocks), kThreads, 0, stream>>>(
        static_cast<const T*>(x), block, static_cast<A*>(out));
    FSDP_CHECK_LAUNCH();
  });
}

}  // namespace fsdp::kernels::cuda
