#include "kernels/cuda/newton_schulz.h"

#include <algorithm>
#include <utility>

#include "kernels/cuda/common.cuh"

namespace fsdp::kernels::cuda {
namespace {

constexpr int kThreads = 256;
// The Frobenius norms are summed in two passes, deterministically: each matrix in up to
// kNormParts parts of at least kNormPartNumel elements (a block each, so a large matrix
// uses many SMs), then the parts in order.
constexpr int kNormParts = 256;
constexpr int64_t kNormPartNumel = 16384;

int norm_parts(int64_t size) {
  return int(std::min<int64_t>(kNormParts, std::max<int64_t>(1, size / kNormPartNumel)));
}

// partials[b * parts + p] = the sum of squares of part p of matrix b of x (blockIdx.x = b,
// blockIdx.y = p), its elements rounded to bf16 first.
template <typename X>
__global__ void norm_parts_kernel(const X* x, int64_t size, float* partials) {
  const int parts = int(gridDim.y), p = int(blockIdx.y);
  const int64_t begin = size * p / parts, end = size * (p + 1) / parts;
  const X* xb = x + int64_t(blockIdx.x) * size;
  float s = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float v = __bfloat162float(__float2bfloat16_rn(to_float(xb[i])));
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partials[int64_t(blockIdx.x) * parts + p] = s;
}

// norms[b] = sqrt of the sum of matrix b's `parts` partial sums (one block per matrix).
__global__ void norms_kernel(const float* partials, int parts, float* norms) {
  float s = 0;
  for (int p = threadIdx.x; p < parts; p += blockDim.x) s += partials[int64_t(blockIdx.x) * parts + p];
  s = block_sum(s);
  if (threadIdx.x == 0) norms[blockIdx.x] = sqrtf(s);
}

// cur (batch, m, n) bf16 = x's matrices in their wide orientation, each rounded to bf16 and
// divided by max(norm, eps).
template <typename X>
__global__ void load_kernel(const X* x, NewtonSchulzDims d, const float* norms, float eps,
                            bf16_t* cur) {
  const int64_t m = d.short_side(), n = d.long_side(), size = m * n;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < d.batch * size;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = e / size, i = (e % size) / n, j = e % n;
    const int64_t src = b * size + (d.tall() ? j * d.cols + i : i * d.cols + j);
    const float v = __bfloat162float(__float2bfloat16_rn(to_float(x[src])));
    cur[e] = __float2bfloat16_rn(v / fmaxf(norms[b], eps));
  }
}

// out (batch, rows, cols) = cur's matrices back in their own orientation.
template <typename O>
__global__ void store_kernel(const bf16_t* cur, NewtonSchulzDims d, O* out) {
  const int64_t m = d.short_side(), n = d.long_side(), size = m * n;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < d.batch * size;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = e / size, i = (e % size) / n, j = e % n;
    const int64_t dst = b * size + (d.tall() ? j * d.cols + i : i * d.cols + j);
    out[dst] = from_float<O>(__bfloat162float(cur[e]));
  }
}

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

size_t newton_schulz_workspace(const NewtonSchulzDims& d) {
  const size_t m = size_t(d.short_side()), n = size_t(d.long_side()), b = size_t(d.batch);
  // Two iterates (m, n) and the Gram matrix and its polynomial (m, m), bf16; the norms and
  // their partial sums.
  return 2 * aligned(b * m * n * 2) + 2 * aligned(b * m * m * 2) + aligned(b * 4) +
         aligned(b * size_t(norm_parts(d.rows * d.cols)) * 4);
}

void newton_schulz(Blas& blas, const NewtonSchulzDims& d, const void* x, DType x_dtype, void* out,
                   DType out_dtype, const NewtonSchulzScalars& s, void* workspace, stream_t stream) {
  const int64_t m = d.short_side(), n = d.long_side();
  if (d.batch == 0 || m == 0) return;
  char* w = static_cast<char*>(workspace);
  auto take = [&w](size_t bytes) {
    char* p = w;
    w += aligned(bytes);
    return p;
  };
  bf16_t* cur = reinterpret_cast<bf16_t*>(take(size_t(d.batch * m * n) * 2));
  bf16_t* next = reinterpret_cast<bf16_t*>(take(size_t(d.batch * m * n) * 2));
  bf16_t* gram = reinterpret_cast<bf16_t*>(take(size_t(d.batch * m * m) * 2));
  bf16_t* poly = reinterpret_cast<bf16_t*>(take(size_t(d.batch * m * m) * 2));
  float* norms = reinterpret_cast<float*>(take(size_t(d.batch) * 4));
  const int parts = norm_parts(d.rows * d.cols);
  float* partials = reinterpret_cast<float*>(take(size_t(d.batch) * size_t(parts) * 4));
  const unsigned grid = grid_for(d.batch * m * n, kThreads);
  dispatch_device_floating(x_dtype, "newton_schulz input", [&](auto xtag) {
    using X = decltype(xtag);
    const X* xp = static_cast<const X*>(x);
    norm_parts_kernel<X><<<dim3(unsigned(d.batch), unsigned(parts)), kThreads, 0, stream>>>(
        xp, d.rows * d.cols, partials);
    FSDP_CHECK_LAUNCH();
    norms_kernel<<<unsigned(d.batch), kThreads, 0, stream>>>(partials, parts, norms);
    FSDP_CHECK_LAUNCH();
    load_kernel<X><<<grid, kThreads, 0, stream>>>(xp, d, norms, float(s.eps), cur);
    FSDP_CHECK_LAUNCH();
  });
  // Batched products over the matrices: (rows, cols, k, trans_b) with strides of whole matrices.
  auto product = [&](void* o, const void* a, const void* b, int64_t rows, int64_t cols, int64_t k,
                     bool trans_b, double alpha, double beta) {
    MatmulDims md;
    md.m = rows;
    md.n = cols;
    md.k = k;
    md.trans_b = trans_b;
    md.batch = d.batch;
    md.batch_stride_a = rows * k;
    md.batch_stride_b = k * cols;
    md.batch_stride_out = rows * cols;
    blas.matmul(md, o, DType::bf16, a, b, DType::bf16, alpha, beta, nullptr, nullptr,
                MatmulEpilogue::None);
  };
  const size_t gram_bytes = size_t(d.batch * m * m) * 2, iterate_bytes = size_t(d.batch * m * n) * 2;
  for (int step = 0; step < s.steps; ++step) {
    product(gram, cur, cur, m, m, n, true, 1.0, 0.0);  // A = X X^T
    FSDP_CALL(cudaMemcpyAsync(poly, gram, gram_bytes, cudaMemcpyDeviceToDevice, stream));
    product(poly, gram, gram, m, m, m, false, s.c, s.b);  // b A + c A A
    FSDP_CALL(cudaMemcpyAsync(next, cur, iterate_bytes, cudaMemcpyDeviceToDevice, stream));
    product(next, poly, cur, m, n, m, false, 1.0, s.a);  // a X + B X
    std::swap(cur, next);
  }
  dispatch_device_floating(out_dtype, "newton_schulz output", [&](auto otag) {
    using O = decltype(otag);
    store_kernel<O><<<grid, kThreads, 0, stream>>>(cur, d, static_cast<O*>(out));
    FSDP_CHECK_LAUNCH();
  });
}

}  // namespace fsdp::kernels::cuda
