// The (64, 128) tile the tensor-wise and row-wise FP8 casts share (kernels/cuda/fp8.cu,
// fp8_rows.cu): a block of 256 threads reads each element of its tile once; each thread
// converts 8 consecutive columns of a row (one 128-bit load of bf16 and one 64-bit store
// into q when vectorized: rows 16-byte aligned), keeps the bytes for the transposed layout
// in shared memory, and then writes 8 consecutive rows of a column of qt (one 64-bit
// store): both global writes are coalesced. The tile's column sums of x (a bias gradient
// from the same read) go to partials (row tiles, cols) in a fixed order.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_encode.cuh"
#include "kernels/cuda/vec.cuh"
#include "kernels/fp8_format.h"
#include "kernels/scalar_math.h"

namespace fsdp::kernels::cuda::fp8_tile {

constexpr int kRows = 64, kCols = 128, kThreads = 256;
constexpr int kRowGroups = kThreads / 16;  // 16 threads of 8 columns span a tile row

// The bytes of the transposed layout, a tile row padded to keep 8-byte stores aligned.
using Bytes = uint8_t[kRows][kCols + 8];

// The tile of this block: its first row and column.
__device__ __forceinline__ int64_t first_row() { return int64_t(blockIdx.y) * kRows; }
__device__ __forceinline__ int64_t first_col() { return int64_t(blockIdx.x) * kCols; }

// v = the 8 elements of x's row r from column c, as floats (0 past the row's end).
template <bool kVec, typename T>
__device__ __forceinline__ void load8(const T* x, int64_t r, int64_t c, int64_t cols, float (&v)[8]) {
  if (kVec && c + 7 < cols) {
    load_floats<8>(x + r * cols + c, v);
    return;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = c + j < cols ? to_float(x[r * cols + c + j]) : 0.0f;
}

// SwiGLU's output silu(g) * u rounded to T, as swiglu_forward stores it.
template <typename T>
__device__ __forceinline__ float swiglu_value(float g, float u) {
  return to_float(from_float<T>(silu(g) * u));
}

// The value at (r, c) of a cast's source (Fp8CastSource) of `cols` columns: x itself, or a
// value from an activation's x (and dout), rounded to T as swiglu_forward, gelu_backward and
// swiglu_backward (kernels/cuda/activation.cu) store it, with the same float expressions, so
// that the cast equals the cast of the stored tensor bit for bit.
template <Fp8CastSource kSource, typename T>
__device__ __forceinline__ float source_value(const T* x, const T* dout, int64_t r, int64_t c,
                                             int64_t cols) {
  if constexpr (kSource == Fp8CastSource::tensor) {
    return to_float(x[r * cols + c]);
  } else if constexpr (kSource == Fp8CastSource::swiglu) {  // x (rows, 2 cols)
    const float g = to_float(x[r * 2 * cols + c]), u = to_float(x[r * 2 * cols + cols + c]);
    return swiglu_value<T>(g, u);
  } else if constexpr (kSource == Fp8CastSource::gelu_grad) {
    const float d = to_float(dout[r * cols + c]), h = to_float(x[r * cols + c]);
    return to_float(from_float<T>(d * gelu_tanh_grad(h)));
  } else {  // swiglu_grad: x (rows, 2F) = [gate | up], dout (rows, F)
    const int64_t f_dim = cols / 2, f = c < f_dim ? c : c - f_dim;
    const float g = to_float(x[r * cols + f]), d = to_float(dout[r * f_dim + f]);
    if (c >= f_dim) return to_float(from_float<T>(d * silu(g)));
    const float u = to_float(x[r * cols + f_dim + f]);
    return to_float(from_float<T>(d * u * silu_grad(g)));
  }
}

// v = the 8 values of the source at row r from column c (0 past the row's end). kVec: whole
// 16-byte-aligned groups of 8 (and, for swiglu and swiglu_grad, F a multiple of 8, so a
// group lies in one half of x).
template <Fp8CastSource kSource, bool kVec, typename T>
__device__ __forceinline__ void load_source8(const T* x, const T* dout, int64_t r, int64_t c,
                                             int64_t cols, float (&v)[8]) {
  if constexpr (kSource == Fp8CastSource::tensor) {
    load8<kVec>(x, r, c, cols, v);
    return;
  }
  if (!kVec || c + 7 >= cols) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      v[j] = c + j < cols ? source_value<kSource>(x, dout, r, c + j, cols) : 0.0f;
    return;
  }
  if constexpr (kSource == Fp8CastSource::swiglu) {
    float u[8];
    load_floats<8>(x + r * 2 * cols + c, v);
    load_floats<8>(x + r * 2 * cols + cols + c, u);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = swiglu_value<T>(v[j], u[j]);
  } else if constexpr (kSource == Fp8CastSource::gelu_grad) {
    float h[8];
    load_floats<8>(dout + r * cols + c, v);
    load_floats<8>(x + r * cols + c, h);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = to_float(from_float<T>(v[j] * gelu_tanh_grad(h[j])));
  } else if constexpr (kSource == Fp8CastSource::swiglu_grad) {
    const int64_t f_dim = cols / 2, f = c < f_dim ? c : c - f_dim;
    float g[8];
    load_floats<8>(x + r * cols + f, g);
    load_floats<8>(dout + r * f_dim + f, v);
    if (c >= f_dim) {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = to_float(from_float<T>(v[j] * silu(g[j])));
    } else {
      float u[8];
      load_floats<8>(x + r * cols + f_dim + f, u);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = to_float(from_float<T>(v[j] * u[j] * silu_grad(g[j])));
    }
  }
}

// The SwiGLU gradient at one (gate, up) pair from the output gradient d, each half rounded
// to T as swiglu_backward stores it (the same expressions as source_value's).
template <typename T>
__device__ __forceinline__ void swiglu_grad_value(float g, float u, float d, float& dg, float& du) {
  dg = to_float(from_float<T>(d * u * silu_grad(g)));
  du = to_float(from_float<T>(d * silu(g)));
}

// The SwiGLU gradient of the 8 (gate, up) pairs of row r from column c of the gate half
// (whole groups: c + 7 < f_dim, rows 16-byte aligned), x (rows, 2 f_dim) = [gate | up] and
// dout (rows, f_dim), read once: dg and du as load_source8 computes each half, bit for bit.
template <typename T>
__device__ __forceinline__ void swiglu_grad8(const T* x, const T* dout, int64_t r, int64_t c,
                                             int64_t f_dim, float (&dg)[8], float (&du)[8]) {
  float g[8], u[8], d[8];
  load_floats<8>(x + r * 2 * f_dim + c, g);
  load_floats<8>(x + r * 2 * f_dim + f_dim + c, u);
  load_floats<8>(dout + r * f_dim + c, d);
#pragma unroll
  for (int j = 0; j < 8; ++j) swiglu_grad_value<T>(g[j], u[j], d[j], dg[j], du[j]);
}

// b into q's row r from column c (clipped at the row's end).
template <bool kVec>
__device__ __forceinline__ void store8(uint8_t* q, int64_t r, int64_t c, int64_t cols,
                                       const uint8_t (&b)[8]) {
  if (kVec && c + 7 < cols) {
    *reinterpret_cast<uint2*>(q + r * cols + c) = fp8_pack8(b);
    return;
  }
  for (int j = 0; j < 8 && c + j < cols; ++j) q[r * cols + c + j] = b[j];
}

// The tile's column sums: each thread's acc of its 8 columns (col8) over its rows (row group
// sub) through `sums` (kRowGroups, kCols) in shared memory, then the groups in order into
// partials' row of this tile. Every thread of the block calls it.
__device__ __forceinline__ void column_sums(float (*sums)[kCols], const float (&acc)[8], int sub,
                                            int col8, int64_t cols, float* partials) {
#pragma unroll
  for (int j = 0; j < 8; ++j) sums[sub][col8 + j] = acc[j];
  __syncthreads();
  const int64_t c0 = first_col();
  if (threadIdx.x < kCols && c0 + threadIdx.x < cols) {
    float total = 0.0f;
    for (int g = 0; g < kRowGroups; ++g) total += sums[g][threadIdx.x];
    partials[int64_t(blockIdx.y) * cols + c0 + threadIdx.x] = total;
  }
}

// The first n_cols columns of the tile's bytes, transposed, into qt's rows from qt_row0 (qt
// has `rows` columns). Every thread of the block calls it, after writing its bytes into
// `tile`.
template <bool kVec>
__device__ __forceinline__ void store_transposed_at(const Bytes& tile, uint8_t* qt, int64_t rows,
                                                    int64_t qt_row0, int64_t n_cols) {
  __syncthreads();
  const int64_t r0 = first_row();
  const bool vec_qt = kVec && rows % 8 == 0;
  const int row8 = (threadIdx.x % 8) * 8, csub = threadIdx.x / 8;  // 32 columns per pass
  for (int cc = csub; cc < kCols; cc += kThreads / 8) {
    const int64_t c = qt_row0 + cc, r = r0 + row8;
    if (cc >= n_cols) break;
    if (r >= rows) continue;
    uint8_t b[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) b[j] = tile[row8 + j][cc];
    if (vec_qt && r + 7 < rows) {
      *reinterpret_cast<uint2*>(qt + c * rows + r) = fp8_pack8(b);
    } else {
      for (int j = 0; j < 8 && r + j < rows; ++j) qt[c * rows + r + j] = b[j];
    }
  }
}

// The tile's bytes, transposed, into qt (cols, rows): this block's columns of x.
template <bool kVec>
__device__ __forceinline__ void store_transposed(const Bytes& tile, uint8_t* qt, int64_t rows,
                                                 int64_t cols) {
  const int64_t c0 = first_col();
  store_transposed_at<kVec>(tile, qt, rows, c0, cols - c0 < kCols ? cols - c0 : kCols);
}

// f(T{}) for the input dtypes the casts take: f32, bf16, f16 (DTypeError naming `what`
// otherwise).
template <typename F>
void dispatch_cast_input(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::f32: f(float{}); return;
    case DType::bf16: f(bf16_t{}); return;
    case DType::f16: f(f16_t{}); return;
    default: FSDP_THROW(DTypeError, what, ": bf16, f16 or f32 input expected, got ", dtype_name(dtype));
  }
}

// The grid of tiles over x (rows, cols); ValueError naming `what` when empty or too tall.
inline dim3 grid(int64_t rows, int64_t cols, const char* what) {
  FSDP_CHECK(rows > 0 && cols > 0 && (rows + kRows - 1) / kRows < 65536, ValueError, what, ": (",
             rows, ", ", cols, ") is empty or has too many rows");
  return dim3(unsigned((cols + kCols - 1) / kCols), unsigned((rows + kRows - 1) / kRows));
}

}  // namespace fsdp::kernels::cuda::fp8_tile
