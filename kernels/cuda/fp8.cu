#include "kernels/cuda/fp8.h"

#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vec.cuh"
#include "kernels/fp8_math.h"

namespace fsdp::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// Each thread folds W consecutive elements per step (one 128-bit load when W > 1).
template <int W, typename T>
__global__ void amax_kernel(const T* x, int64_t n, unsigned* amax) {
  float m = 0.0f;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * W;
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * W; i < n; i += stride) {
    float v[W];
    load_floats<W>(x + i, v);
#pragma unroll
    for (int j = 0; j < W; ++j) m = fmaxf(m, fabsf(v[j]));  // fmaxf drops NaN
  }
  m = block_max(m);
  // Non-negative floats order as their bit patterns do: an integer max is a float max.
  if (threadIdx.x == 0 && m > 0.0f) atomicMax(amax, __float_as_uint(m));
}

__global__ void compute_scale_kernel(const float* amax, float fp8_max, float* scale,
                                     float* scale_inv) {
  const float s = fp8_scale_from_amax(*amax, fp8_max);
  *scale = s;
  *scale_inv = 1.0f / s;
}

// V elements of T in one load (V = 4: 8 bytes of bf16, 16 of f32).
template <typename T, int V>
struct alignas(sizeof(T) * V) Elements {
  T v[V];
};

// The cast of one 64 x 64 tile per block and step, through shared memory for the
// transpose. Each thread converts V consecutive elements of a row (V = 4 when rows and cols
// are multiples of 4 and the buffers aligned: one load, one 4-byte store each way; V = 1
// otherwise) and writes V consecutive bytes of a transposed row. The conversion is
// elementwise, so both widths give the same bytes.
constexpr int kTile = 64;

template <int V, typename T>
__global__ void quantize_kernel(const T* x, int64_t rows, int64_t cols, const float* scale,
                                uint8_t* out, uint8_t* out_t, __nv_fp8_interpretation_t kind) {
  __shared__ uint8_t tile[kTile][kTile + 4];  // +4: a transposed read spreads over banks
  constexpr int kLanes = kTile / V;           // threads along a row of the tile
  constexpr int kRowsPerPass = kThreads / kLanes;
  const float s = *scale;
  const int lane = threadIdx.x % kLanes, row_in_pass = threadIdx.x / kLanes;
  const int64_t c0 = int64_t(blockIdx.x) * kTile;
  const int64_t tile_rows = (rows + kTile - 1) / kTile;
  for (int64_t tr = blockIdx.y; tr < tile_rows; tr += gridDim.y) {
    const int64_t r0 = tr * kTile;
    for (int i = row_in_pass; i < kTile; i += kRowsPerPass) {
      const int64_t r = r0 + i, c = c0 + int64_t(lane) * V;
      if (r >= rows || c >= cols) continue;  // V > 1: cols % V == 0, so all V are in range
      const Elements<T, V> e = *reinterpret_cast<const Elements<T, V>*>(x + r * cols + c);
      uint8_t q[V];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        q[j] = to_fp8_bits(to_float(e.v[j]) * s, kind);
        tile[i][lane * V + j] = q[j];
      }
      if (out) {
        if constexpr (V == 4)
          *reinterpret_cast<uchar4*>(out + r * cols + c) = make_uchar4(q[0], q[1], q[2], q[3]);
        else
          out[r * cols + c] = q[0];
      }
    }
    if (out_t) {  // the same for every thread of the block: the barriers are reached by all
      __syncthreads();
      // out_t (cols, rows): row c0 + j holds column j of the tile, V rows of x at a time.
      for (int j = row_in_pass; j < kTile; j += kRowsPerPass) {
        const int64_t c = c0 + j, r = r0 + int64_t(lane) * V;
        if (c >= cols || r >= rows) continue;  // V > 1: rows % V == 0
        if constexpr (V == 4) {
          *reinterpret_cast<uchar4*>(out_t + c * rows + r) =
              make_uchar4(tile[lane * V][j], tile[lane * V + 1][j], tile[lane * V + 2][j],
                          tile[lane * V + 3][j]);
        } else {
          out_t[c * rows + r] = tile[lane][j];
        }
      }
      __syncthreads();  // the tile is rewritten by the next step
    }
  }
}

__nv_fp8_interpretation_t fp8_kind(DType fp8) {
  FSDP_CHECK(is_fp8(fp8), DTypeError, "fp8_quantize: FP8 dtype (f8e4m3, f8e5m2) expected, got ",
             dtype_name(fp8));
  return fp8 == DType::f8e4m3 ? __NV_E4M3 : __NV_E5M2;
}

bool aligned_to(const void* p, size_t bytes) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

}  // namespace

void fp8_amax(const void* x, DType dtype, int64_t n, float* amax, CUstream_st* stream) {
  FSDP_CALL(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  if (n == 0) return;
  dispatch_device_floating(dtype, "fp8_amax", [&](auto tag) {
    using T = decltype(tag);
    dispatch_width<T>(n, {x}, [&](auto width) {
      constexpr int W = decltype(width)::value;
      // A few blocks per SM keep the loads in flight; each block then does one atomic.
      const unsigned blocks = grid_for((n + W - 1) / W, kThreads, 1024);
      amax_kernel<W, T><<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(x), n,
                                                         reinterpret_cast<unsigned*>(amax));
      FSDP_CHECK_LAUNCH();
    });
  });
}

void fp8_compute_scale(const float* amax, float fp8_max, float* scale, float* scale_inv,
                       CUstream_st* stream) {
  compute_scale_kernel<<<1, 1, 0, stream>>>(amax, fp8_max, scale, scale_inv);
  FSDP_CHECK_LAUNCH();
}

void fp8_quantize(const void* x, DType dtype, int64_t rows, int64_t cols, const float* scale,
                  void* out, void* out_t, DType fp8, CUstream_st* stream) {
  const __nv_fp8_interpretation_t kind = fp8_kind(fp8);
  if (rows == 0 || cols == 0 || (!out && !out_t)) return;
  dispatch_device_floating(dtype, "fp8_quantize", [&](auto tag) {
    using T = decltype(tag);
    const int64_t col_tiles = (cols + kTile - 1) / kTile, row_tiles = (rows + kTile - 1) / kTile;
    FSDP_CHECK(col_tiles <= 2147483647, ShapeError, "fp8_quantize: ", cols, " columns");
    const dim3 grid(unsigned(col_tiles), unsigned(std::min<int64_t>(row_tiles, 65535)));
    const bool wide = rows % 4 == 0 && cols % 4 == 0 && aligned_to(x, 4 * sizeof(T)) &&
                      aligned_to(out, 4) && aligned_to(out_t, 4);
    auto* o = static_cast<uint8_t*>(out);
    auto* ot = static_cast<uint8_t*>(out_t);
    if (wide)
      quantize_kernel<4, T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), rows, cols,
                                                           scale, o, ot, kind);
    else
      quantize_kernel<1, T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(x), rows, cols,
                                                           scale, o, ot, kind);
    FSDP_CHECK_LAUNCH();
  });
}

}  // namespace fsdp::kernels::cuda
