#include "kernels/cuda/column_sum.h"

#include <algorithm>

#include "kernels/cuda/column_sum.h"
#include "kernels/cuda/vec.cuh"

namespace fsdp::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kRowsPerBlock = 64;  // target; the block count is capped below
constexpr int64_t kMaxRowBlocks = 1024;

// Block (x, y) sums rows [y * rows, (y + 1) * rows) of W consecutive columns per thread.
template <int W, typename T>
__global__ void column_partials_kernel(const T* x, int64_t m, int64_t n, int64_t rows,
                                       float* partials) {
  const int64_t c0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * W;
  if (c0 >= n) return;
  const int64_t r0 = int64_t(blockIdx.y) * rows, r1 = min(m, r0 + rows);
  float acc[W] = {};
  for (int64_t r = r0; r < r1; ++r) {
    float v[W];
    load_floats<W>(x + r * n + c0, v);
#pragma unroll
    for (int i = 0; i < W; ++i) acc[i] += v[i];
  }
#pragma unroll
  for (int i = 0; i < W; ++i) partials[int64_t(blockIdx.y) * n + c0 + i] = acc[i];
}

// Block (32 x groups) finishes 32 columns: thread (x, y) sums the partial rows y, y + groups,
// ... of column x, then row y = 0 adds the group sums in order. groups = min(blocks, 32) is a
// function of the row count alone, so the result is deterministic.
constexpr int kGroups = 32;

template <typename G>
__global__ void finish_kernel(const float* partials, int64_t blocks, int64_t n, G* out,
                              bool accumulate) {
  __shared__ float group_sums[kGroups][kWarp + 1];
  const int64_t c = int64_t(blockIdx.x) * kWarp + threadIdx.x;
  float s = 0;
  if (c < n)
    for (int64_t b = threadIdx.y; b < blocks; b += blockDim.y) s += partials[b * n + c];
  group_sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || c >= n) return;
  float total = 0;
  for (int g = 0; g < int(blockDim.y); ++g) total += group_sums[g][threadIdx.x];
  out[c] = from_float<G>(accumulate ? to_float(out[c]) + total : total);
}

}  // namespace

int64_t column_row_blocks(int64_t m) {
  return std::clamp<int64_t>((m + kRowsPerBlock - 1) / kRowsPerBlock, 1, kMaxRowBlocks);
}

void column_partials(const void* x, DType dtype, int64_t m, int64_t n, float* partials,
                     stream_t stream) {
  const int64_t blocks = column_row_blocks(m);
  const int64_t rows = (m + blocks - 1) / blocks;
  dispatch_compute(dtype, "column sums", [&](auto tag) {
    using T = decltype(tag);
    dispatch_width<T>(n, {x}, [&](auto w) {
      constexpr int W = decltype(w)::value;
      const dim3 grid(unsigned((n / W + kThreads - 1) / kThreads), unsigned(blocks));
      column_partials_kernel<W, T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), m, n,
                                                                  rows, partials);
      FSDP_CHECK_LAUNCH();
    });
  });
}

void finish_column_sums(const float* partials, int64_t blocks, int64_t n, void* out,
                        DType out_dtype, bool accumulate, stream_t stream) {
  dispatch_compute(out_dtype, "column sums output", [&](auto tag) {
    using G = decltype(tag);
    const dim3 block(kWarp, unsigned(std::min<int64_t>(blocks, kGroups)));
    finish_kernel<G><<<unsigned((n + kWarp - 1) / kWarp), block, 0, stream>>>(
        partials, blocks, n, static_cast<G*>(out), accumulate);
    FSDP_CHECK_LAUNCH();
  });
}

size_t column_sum_workspace_bytes(int64_t m, int64_t n) {
  return size_t(column_row_blocks(m) * n) * sizeof(float);
}

void bias_backward(void* dbias, DType grad_dtype, const void* dout, DType dtype, int64_t m,
                   int64_t n, bool accumulate, void* workspace, stream_t stream) {
  if (n == 0) return;
  float* partials = static_cast<float*>(workspace);
  column_partials(dout, dtype, m, n, partials, stream);
  finish_column_sums(partials, column_row_blocks(m), n, dbias, grad_dtype, accumulate, stream);
}

}  // namespace fsdp::kernels::cuda
