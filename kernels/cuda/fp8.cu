#include "kernels/cuda/fp8.h"

#include <type_traits>

#include "kernels/cuda/activation.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_block8.cuh"
#include "kernels/cuda/fp8_tile.cuh"
#include "kernels/cuda/vec.cuh"

namespace fsdp::kernels::cuda {
namespace {

// The block's maximum of each thread's m into *amax_bits with an integer atomicMax: for
// non-negative floats the bit patterns order as the values do, so the result does not depend
// on the order. Every thread of the block calls it.
__device__ __forceinline__ void fold_block_amax(float m, unsigned* amax_bits) {
  m = block_max(m);
  if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(m));
}

// The cast's scale for *amax; the grid's first thread writes its inverse for the products.
__device__ __forceinline__ float cast_scale(const float* amax, Fp8Format format, float* scale_inv) {
  const float scale = fp8_scale_for_amax(*amax, format);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *scale_inv = __frcp_rn(scale);
  return scale;
}

// Each thread folds W elements at a time (W = 1, or one 128-bit pack), then the block's
// maximum goes into *amax_bits (fold_block_amax).
template <typename T, int W>
__global__ void amax_kernel(const T* x, int64_t n, unsigned* amax_bits) {
  float m = 0.0f;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * W;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * W; i < n; i += stride) {
    float v[W];
    load_floats<W>(x + i, v);
#pragma unroll
    for (int j = 0; j < W; ++j) m = fmaxf(m, fabsf(v[j]));
  }
  fold_block_amax(m, amax_bits);
}

namespace tile = fp8_tile;

// The amax of an activation's gradient (rows, cols) (tile::source_value), each thread
// folding groups of 8 columns (kVec) or single elements.
template <Fp8CastSource kSource, typename T, bool kVec>
__global__ void source_amax_kernel(const T* x, const T* dout, int64_t rows, int64_t cols,
                                   unsigned* amax_bits) {
  float m = 0.0f;
  const int64_t per_row = kVec ? cols / 8 : cols, n = rows * per_row;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, c = (i % per_row) * (kVec ? 8 : 1);
    if constexpr (kVec) {
      float v[8];
      tile::load_source8<kSource, true>(x, dout, r, c, cols, v);
#pragma unroll
      for (int j = 0; j < 8; ++j) m = fmaxf(m, fabsf(v[j]));
    } else {
      m = fmaxf(m, fabsf(tile::source_value<kSource>(x, dout, r, c, cols)));
    }
  }
  fold_block_amax(m, amax_bits);
}

// q and qt of one (64, 128) tile (kernels/cuda/fp8_tile.cuh) of the source (x, or an
// activation's gradient from x and dout), every byte by one scale; with kSums the tile's
// column sums of the source (unscaled) go to partials.
template <Fp8CastSource kSource, typename T, bool kVec, bool kSums>
__global__ void quantize_kernel(const T* x, const T* dout, int64_t rows, int64_t cols, const float* amax,
                                Fp8Format format, uint8_t* q, uint8_t* qt, float* scale_inv,
                                float* partials, unsigned* record_amax_bits) {
  __shared__ __align__(8) tile::Bytes bytes;
  __shared__ float sums[kSums ? tile::kRowGroups : 1][kSums ? tile::kCols : 1];
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  float seen = 0.0f;  // max |x| over this thread's elements (record_amax_bits)
  const float scale = cast_scale(amax, format, scale_inv);
  const int64_t r0 = tile::first_row(), c0 = tile::first_col();
  const int col8 = (threadIdx.x % 16) * 8, sub = threadIdx.x / 16;  // 16 rows per pass
  for (int rr = sub; rr < tile::kRows; rr += tile::kRowGroups) {
    const int64_t r = r0 + rr, c = c0 + col8;
    if (r >= rows) break;
    float v[8];
    tile::load_source8<kSource, kVec>(x, dout, r, c, cols, v);
    uint8_t b[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      b[j] = fp8_encode_satfinite(__fmul_rn(v[j], scale), format);
      if (kSums) acc[j] += v[j];
      seen = fmaxf(seen, fabsf(v[j]));
    }
    *reinterpret_cast<uint2*>(&bytes[rr][col8]) = fp8_pack8(b);
    if (q) tile::store8<kVec>(q, r, c, cols, b);
  }
  if (record_amax_bits) fold_block_amax(seen, record_amax_bits);  // the same for the whole block
  if constexpr (kSums) tile::column_sums(sums, acc, sub, col8, cols, partials);
  if (qt) tile::store_transposed<kVec>(bytes, qt, rows, cols);
}

// quantize_kernel's cast with the transpose in registers (kernels/cuda/fp8_block8.cuh): a
// block of 128 threads covers the same (64, 128) tile, each warp a (32, 64) quarter of it and
// each thread an (8, 8) block (8 rows of 8 columns) whose bytes it writes in both layouts
// from its registers: no shared memory and no barrier between the read and the transposed
// write. Lanes 0-7 of a warp take consecutive column groups of one row group, so a
// row load reads 128 contiguous bytes, and the warp's 4 row groups write 32 contiguous bytes
// of each qt row. The same bytes as quantize_kernel; whole (8, 8) blocks only (rows and cols
// multiples of 8, inputs 16-byte aligned, q and qt 8-byte), no column sums.
constexpr int kRegsThreads = 128;

// The first row and column of this thread's (8, 8) block in the block's (64, 128) tile.
__device__ __forceinline__ void regs_block_origin(int64_t& r, int64_t& c) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  r = tile::first_row() + (warp & 1) * 32 + (lane / 8) * 8;
  c = tile::first_col() + (warp >> 1) * 64 + (lane % 8) * 8;
}

template <Fp8CastSource kSource, typename T>
__global__ void __launch_bounds__(kRegsThreads)
    quantize_regs_kernel(const T* x, const T* dout, int64_t rows, int64_t cols, const float* amax,
                         Fp8Format format, uint8_t* q, uint8_t* qt, float* scale_inv,
                         unsigned* record_amax_bits) {
  const float scale = cast_scale(amax, format, scale_inv);
  int64_t r, c;
  regs_block_origin(r, c);
  float seen = 0.0f;  // max |value| over this thread's elements (record_amax_bits)
  if (r < rows && c < cols) {
    uint2 b[8];  // row i of the block: byte j = column c + j
    auto encode = [&](int i, const float (&v)[8]) {
#pragma unroll
      for (int j = 0; j < 8; ++j) seen = fmaxf(seen, fabsf(v[j]));
      b[i] = fp8_block8::encode_row(v, scale, format);
    };
    // Every load of the block issued before the first conversion (128 bytes in flight per
    // thread for a bf16 tensor, 256 for SwiGLU's gate and up).
    if constexpr (kSource == Fp8CastSource::tensor) {
      Packs<8, T> raw[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) raw[i] = load_packs<8>(x + (r + i) * cols + c);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float v[8];
        unpack_floats(raw[i], v);
        encode(i, v);
      }
    } else if constexpr (kSource == Fp8CastSource::swiglu) {  // x (rows, 2 cols) = [gate | up]
      Packs<8, T> gate[8], up[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        gate[i] = load_packs<8>(x + (r + i) * 2 * cols + c);
        up[i] = load_packs<8>(x + (r + i) * 2 * cols + cols + c);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float g[8], u[8], v[8];
        unpack_floats(gate[i], g);
        unpack_floats(up[i], u);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = tile::swiglu_value<T>(g[j], u[j]);
        encode(i, v);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float v[8];
        tile::load_source8<kSource, true>(x, dout, r + i, c, cols, v);
        encode(i, v);
      }
    }
    fp8_block8::store_both(b, q, cols, qt, rows, r, c);
  }
  if (record_amax_bits) fold_block_amax(seen, record_amax_bits);  // the same for the whole block
}

// swiglu_grad_quantize_kernel with the transpose in registers, as quantize_regs_kernel: each
// thread an (8, 8) block of (gate, up) pairs (gate, up and dout loaded together), whose
// gradient bytes it writes in both layouts for both halves. The same bytes; whole (8, 8)
// blocks only (rows and f_dim multiples of 8, inputs 16-byte aligned, q and qt 8-byte).
template <typename T>
__global__ void __launch_bounds__(kRegsThreads)
    swiglu_grad_regs_kernel(const T* x, const T* dout, int64_t rows, int64_t f_dim,
                            const float* amax, Fp8Format format, uint8_t* q, uint8_t* qt,
                            float* scale_inv, unsigned* record_amax_bits) {
  const float scale = cast_scale(amax, format, scale_inv);
  int64_t r, c;
  regs_block_origin(r, c);
  const int64_t cols = 2 * f_dim;
  float seen = 0.0f;  // max |value| over this thread's elements of both halves
  if (r < rows && c < f_dim) {
    Packs<8, T> g[8], u[8], d[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      g[i] = load_packs<8>(x + (r + i) * cols + c);
      u[i] = load_packs<8>(x + (r + i) * cols + f_dim + c);
      d[i] = load_packs<8>(dout + (r + i) * f_dim + c);
    }
    uint2 bg[8], bu[8];  // row i of each half's block: byte j = column c + j
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float gv[8], uv[8], dv[8], dg[8], du[8];
      unpack_floats(g[i], gv);
      unpack_floats(u[i], uv);
      unpack_floats(d[i], dv);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        tile::swiglu_grad_value<T>(gv[j], uv[j], dv[j], dg[j], du[j]);
        seen = fmaxf(seen, fmaxf(fabsf(dg[j]), fabsf(du[j])));
      }
      bg[i] = fp8_block8::encode_row(dg, scale, format);
      bu[i] = fp8_block8::encode_row(du, scale, format);
    }
    fp8_block8::store_both(bg, q, cols, qt, rows, r, c);
    fp8_block8::store_both(bu, q, cols, qt, rows, r, f_dim + c);
  }
  if (record_amax_bits) fold_block_amax(seen, record_amax_bits);  // the same for the whole block
}

// The SwiGLU gradient's cast with each (gate, up) pair read once. quantize_kernel's tiles
// each cover one half of the (rows, 2 f_dim) gradient, so the gate half's tiles read gate, up
// and dout and the up half's read gate and dout again: 14 bytes per pair where 10 do. Here a
// block covers a (64, 128) tile of the gate half's columns and the same columns of the up
// half, computing both gradients from one read (tile::swiglu_grad8), with the same bytes.
// Whole groups of 8 only (f_dim % 8 == 0, rows 16-byte aligned); no column sums (SwiGLU's
// gate and up have no bias). Serves row counts that are not a multiple of 8;
// swiglu_grad_regs_kernel the rest.
template <typename T>
__global__ void swiglu_grad_quantize_kernel(const T* x, const T* dout, int64_t rows, int64_t f_dim,
                                            const float* amax, Fp8Format format, uint8_t* q,
                                            uint8_t* qt, float* scale_inv,
                                            unsigned* record_amax_bits) {
  __shared__ __align__(8) tile::Bytes gate_bytes;
  __shared__ __align__(8) tile::Bytes up_bytes;
  float seen = 0.0f;  // max |value| over this thread's elements of both halves
  const float scale = cast_scale(amax, format, scale_inv);
  const int64_t cols = 2 * f_dim, r0 = tile::first_row(), c0 = tile::first_col();  // c0 < f_dim
  const int col8 = (threadIdx.x % 16) * 8, sub = threadIdx.x / 16;  // 16 rows per pass
  const int64_t c = c0 + col8;
  if (c < f_dim) {
    for (int rr = sub; rr < tile::kRows; rr += tile::kRowGroups) {
      const int64_t r = r0 + rr;
      if (r >= rows) break;
      float dg[8], du[8];
      tile::swiglu_grad8(x, dout, r, c, f_dim, dg, du);
      uint8_t bg[8], bu[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        bg[j] = fp8_encode_satfinite(__fmul_rn(dg[j], scale), format);
        bu[j] = fp8_encode_satfinite(__fmul_rn(du[j], scale), format);
        seen = fmaxf(seen, fmaxf(fabsf(dg[j]), fabsf(du[j])));
      }
      *reinterpret_cast<uint2*>(&gate_bytes[rr][col8]) = fp8_pack8(bg);
      *reinterpret_cast<uint2*>(&up_bytes[rr][col8]) = fp8_pack8(bu);
      if (q) {
        *reinterpret_cast<uint2*>(q + r * cols + c) = fp8_pack8(bg);
        *reinterpret_cast<uint2*>(q + r * cols + f_dim + c) = fp8_pack8(bu);
      }
    }
  }
  if (record_amax_bits) fold_block_amax(seen, record_amax_bits);  // the same for the whole block
  if (qt) {
    const int64_t n_cols = f_dim - c0 < tile::kCols ? f_dim - c0 : tile::kCols;
    tile::store_transposed_at<true>(gate_bytes, qt, rows, c0, n_cols);
    tile::store_transposed_at<true>(up_bytes, qt, rows, f_dim + c0, n_cols);
  }
}

// The amax of the SwiGLU gradient (both halves) with each (gate, up) pair read once (as
// swiglu_grad_quantize_kernel), each thread folding groups of 8 pairs.
template <typename T>
__global__ void swiglu_grad_amax_kernel(const T* x, const T* dout, int64_t rows, int64_t f_dim,
                                        unsigned* amax_bits) {
  float m = 0.0f;
  const int64_t per_row = f_dim / 8, n = rows * per_row;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float dg[8], du[8];
    tile::swiglu_grad8(x, dout, i / per_row, (i % per_row) * 8, f_dim, dg, du);
#pragma unroll
    for (int j = 0; j < 8; ++j) m = fmaxf(m, fmaxf(fabsf(dg[j]), fabsf(du[j])));
  }
  fold_block_amax(m, amax_bits);
}

// Whether the source's rows split into whole groups of 8 (for swiglu_grad, each half too; a
// swiglu source's rows are F long).
bool source_vectorizes(Fp8CastSource source, int64_t cols) {
  return cols % 8 == 0 && (source != Fp8CastSource::swiglu_grad || (cols / 2) % 8 == 0);
}

// f(std::integral_constant<Fp8CastSource, source>{}).
template <typename F>
void dispatch_source(Fp8CastSource source, F&& f) {
  switch (source) {
    case Fp8CastSource::tensor: f(std::integral_constant<Fp8CastSource, Fp8CastSource::tensor>{}); return;
    case Fp8CastSource::swiglu: f(std::integral_constant<Fp8CastSource, Fp8CastSource::swiglu>{}); return;
    case Fp8CastSource::gelu_grad: f(std::integral_constant<Fp8CastSource, Fp8CastSource::gelu_grad>{}); return;
    case Fp8CastSource::swiglu_grad: f(std::integral_constant<Fp8CastSource, Fp8CastSource::swiglu_grad>{}); return;
  }
}

__global__ void scalars_kernel(float* alpha_beta, const float* sa, const float* sb, float alpha,
                               float beta) {
  alpha_beta[0] = __fmul_rn(alpha, __fmul_rn(*sa, *sb));
  alpha_beta[1] = beta;
}

}  // namespace

int compute_capability(int device) {
  int major = 0, minor = 0;
  FSDP_CALL(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  FSDP_CALL(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

void fp8_amax(float* amax, const void* x, DType dtype, int64_t n, stream_t stream) {
  FSDP_CALL(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  if (n == 0) return;
  tile::dispatch_cast_input(dtype, "fp8_amax", [&](auto tag) {
    using T = decltype(tag);
    dispatch_width<T>(n, {x}, [&](auto width) {
      constexpr int W = decltype(width)::value;
      const int64_t blocks = std::min<int64_t>((n / W + 255) / 256, 2048);
      amax_kernel<T, W><<<unsigned(blocks), 256, 0, stream>>>(
          static_cast<const T*>(x), n, reinterpret_cast<unsigned*>(amax));
    });
  });
  FSDP_CHECK_LAUNCH();
}

void fp8_amax(float* amax, const void* x, const void* dout, Fp8CastSource source, DType dtype,
              int64_t rows, int64_t cols, stream_t stream) {
  if (source == Fp8CastSource::tensor) return fp8_amax(amax, x, dtype, rows * cols, stream);
  FSDP_CALL(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  if (rows == 0 || cols == 0) return;
  const bool vec = source_vectorizes(source, cols) && aligned16(x) && aligned16(dout);
  tile::dispatch_cast_input(dtype, "fp8_amax", [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto source_tag, auto vec_tag) {
      constexpr Fp8CastSource kSource = decltype(source_tag)::value;
      constexpr bool kVec = decltype(vec_tag)::value;
      constexpr bool kPairs = kSource == Fp8CastSource::swiglu_grad && kVec;  // 8 pairs a thread
      const int64_t n = rows * (kPairs ? cols / 16 : kVec ? cols / 8 : cols);
      const int64_t blocks = std::min<int64_t>((n + 255) / 256, 2048);
      if constexpr (kPairs) {
        swiglu_grad_amax_kernel<T><<<unsigned(blocks), 256, 0, stream>>>(
            static_cast<const T*>(x), static_cast<const T*>(dout), rows, cols / 2,
            reinterpret_cast<unsigned*>(amax));
      } else {
        source_amax_kernel<kSource, T, kVec><<<unsigned(blocks), 256, 0, stream>>>(
            static_cast<const T*>(x), static_cast<const T*>(dout), rows, cols,
            reinterpret_cast<unsigned*>(amax));
      }
    };
    dispatch_source(source, [&](auto source_tag) {
      if (vec) launch(source_tag, std::true_type{});
      else launch(source_tag, std::false_type{});
    });
  });
  FSDP_CHECK_LAUNCH();
}

int64_t fp8_column_sum_tiles(int64_t rows) { return (rows + tile::kRows - 1) / tile::kRows; }

void fp8_quantize(const void* x, const void* dout, Fp8CastSource source, DType dtype,
                  int64_t rows, int64_t cols, const float* amax, Fp8Format format, uint8_t* q,
                  uint8_t* qt, float* scale_inv, const ColumnSums& column_sums,
                  float* record_amax, stream_t stream) {
  float* partials = column_sums.out ? column_sums.partials : nullptr;
  const dim3 grid = tile::grid(rows, cols, "fp8_quantize");
  // Whole 8-element groups: rows of the inputs start 16-byte aligned, those of q and qt 8-byte.
  const bool vec = source_vectorizes(source, cols) && aligned16(x) && aligned16(dout) &&
                   uintptr_t(q) % 8 == 0 && uintptr_t(qt) % 8 == 0;
  tile::dispatch_cast_input(dtype, "fp8_quantize", [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto source_tag, auto vec_tag, auto sums_tag) {
      constexpr Fp8CastSource kSource = decltype(source_tag)::value;
      constexpr bool kVec = decltype(vec_tag)::value, kSums = decltype(sums_tag)::value;
      if constexpr (kSource == Fp8CastSource::swiglu_grad && kVec && !kSums) {
        // A block per tile of the gate half's columns, with the same columns of the up half.
        const int64_t f_dim = cols / 2;
        if (rows % 8 == 0) {  // whole (8, 8) blocks
          swiglu_grad_regs_kernel<T><<<tile::grid(rows, f_dim, "fp8_quantize"), kRegsThreads, 0, stream>>>(
              static_cast<const T*>(x), static_cast<const T*>(dout), rows, f_dim, amax, format,
              q, qt, scale_inv, reinterpret_cast<unsigned*>(record_amax));
        } else {
          swiglu_grad_quantize_kernel<T><<<tile::grid(rows, f_dim, "fp8_quantize"), tile::kThreads, 0, stream>>>(
              static_cast<const T*>(x), static_cast<const T*>(dout), rows, f_dim, amax, format,
              q, qt, scale_inv, reinterpret_cast<unsigned*>(record_amax));
        }
      } else {
        if constexpr (kVec && !kSums) {
          if (rows % 8 == 0) {  // whole (8, 8) blocks: the transpose in registers
            quantize_regs_kernel<kSource, T><<<grid, kRegsThreads, 0, stream>>>(
                static_cast<const T*>(x), static_cast<const T*>(dout), rows, cols, amax, format,
                q, qt, scale_inv, reinterpret_cast<unsigned*>(record_amax));
            return;
          }
        }
        quantize_kernel<kSource, T, kVec, kSums><<<grid, tile::kThreads, 0, stream>>>(
            static_cast<const T*>(x), static_cast<const T*>(dout), rows, cols, amax, format, q,
            qt, scale_inv, partials, reinterpret_cast<unsigned*>(record_amax));
      }
    };
    using yes = std::true_type;
    using no = std::false_type;
    dispatch_source(source, [&](auto source_tag) {
      if (vec && partials) launch(source_tag, yes{}, yes{});
      else if (vec) launch(source_tag, yes{}, no{});
      else if (partials) launch(source_tag, no{}, yes{});
      else launch(source_tag, no{}, no{});
    });
  });
  FSDP_CHECK_LAUNCH();
  if (partials)
    finish_column_sums(partials, fp8_column_sum_tiles(rows), cols, column_sums.out,
                       column_sums.out_dtype, true, stream);
}

void fp8_quantize(const void* x, DType dtype, int64_t rows, int64_t cols, const float* amax,
                  Fp8Format format, uint8_t* q, uint8_t* qt, float* scale_inv,
                  const ColumnSums& column_sums, float* record_amax, stream_t stream) {
  fp8_quantize(x, nullptr, Fp8CastSource::tensor, dtype, rows, cols, amax, format, q, qt,
               scale_inv, column_sums, record_amax, stream);
}

void fp8_quantize_flat(const void* x, DType dtype, int64_t n, const float* amax,
                       Fp8Format format, uint8_t* q, float* scale_inv, stream_t stream) {
  // Rows of kCols elements (the cast's tiles are 2-D), then the remainder as one row.
  constexpr int64_t kCols = 4096;
  const int64_t full = n / kCols, rest = n % kCols;
  const auto* xp = static_cast<const char*>(x);
  if (full > 0)
    fp8_quantize(xp, dtype, full, kCols, amax, format, q, nullptr, scale_inv, {}, nullptr, stream);
  if (rest > 0)
    fp8_quantize(xp + full * kCols * int64_t(dtype_size(dtype)), dtype, 1, rest, amax, format,
                 q + full * kCols, nullptr, scale_inv, {}, nullptr, stream);
}

namespace {

// One thread per (layer, operand): fp8_update_amax_history on its strided history.
__global__ void update_histories_kernel(float* history, const float* step_amax, float* scale_amax,
                                        int64_t layers, int64_t len, int64_t width, bool roll,
                                        bool use_max, float margin_factor) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= layers * width) return;
  const int64_t l = i / width, o = i % width;
  scale_amax[i] = fp8_update_amax_history(history + l * len * width + o, len, width, step_amax[i],
                                          roll, use_max, margin_factor);
}

__global__ void scale_inverses_kernel(const float* amax, int64_t n, Fp8Format format,
                                      float* scale_inv) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) scale_inv[i] = __frcp_rn(fp8_scale_for_amax(amax[i], format));
}

}  // namespace

void fp8_scale_inverses(const float* amax, int64_t n, Fp8Format format, float* scale_inv,
                        stream_t stream) {
  if (n == 0) return;
  scale_inverses_kernel<<<unsigned((n + 127) / 128), 128, 0, stream>>>(amax, n, format, scale_inv);
  FSDP_CHECK_LAUNCH();
}

void fp8_update_amax_histories(float* history, const float* step_amax, float* scale_amax,
                               int64_t layers, int64_t len, int64_t width, bool roll,
                               bool use_max, float margin_factor, stream_t stream) {
  const int64_t n = layers * width;
  if (n == 0) return;
  update_histories_kernel<<<unsigned((n + 127) / 128), 128, 0, stream>>>(
      history, step_amax, scale_amax, layers, len, width, roll, use_max, margin_factor);
  FSDP_CHECK_LAUNCH();
}

void fp8_matmul_scalars(float* alpha_beta, const float* scale_inv_a, const float* scale_inv_b,
                        float alpha, float beta, stream_t stream) {
  scalars_kernel<<<1, 1, 0, stream>>>(alpha_beta, scale_inv_a, scale_inv_b, alpha, beta);
  FSDP_CHECK_LAUNCH();
}

namespace {

// out (M, N) += bias (N) broadcast over the rows, through a contiguous copy of the broadcast
// bias (as a Tensor-level add of a stride-0 view would make it).
void add_bias_rows(int64_t m, int64_t n, void* out, DType dtype, const void* bias,
                   const Scratch& scratch, stream_t stream) {
  StridedLayout dense, rows;
  dense.rank = rows.rank = 2;
  dense.shape[0] = rows.shape[0] = m;
  dense.shape[1] = rows.shape[1] = n;
  dense.strides[0] = n;
  dense.strides[1] = rows.strides[1] = 1;
  rows.strides[0] = 0;
  void* broadcast = scratch(size_t(m * n) * dtype_size(dtype));
  copy(broadcast, dtype, dense, bias, dtype, rows, stream);
  binary(BinaryOp::Add, out, out, broadcast, m * n, dtype, dtype, stream);
}

}  // namespace

void fp8_matmul(Blas& blas, int64_t m, int64_t n, int64_t k, void* out, DType out_dtype,
                const uint8_t* a, Fp8Format format_a, const float* scale_inv_a, const uint8_t* b,
                Fp8Format format_b, const float* scale_inv_b, double alpha, double beta,
                const void* bias, void* aux, MatmulEpilogue epilogue, bool fast_accum,
                const Scratch& scratch, stream_t stream) {
  const bool gelu = epilogue == MatmulEpilogue::Gelu, dgelu = epilogue == MatmulEpilogue::DGelu;
  auto run = [&](void* o, DType od, double be, const void* bi, MatmulEpilogue ep, void* ax) {
    return blas.try_fp8_matmul(m, n, k, o, od, a, format_a, scale_inv_a, b, format_b,
                               scale_inv_b, alpha, be, bi, ax, ep, fast_accum);
  };
  // The GELU gradient is ours, after the plain product: cuBLASLt's FP8 DGELU kernels ran
  // at a quarter of the plain product's speed on the H200 (bench fp8-matmul).
  if (!dgelu && run(out, out_dtype, beta, bias, epilogue, aux)) return;
  // cuBLASLt's FP8 kernels lack this epilogue or output: the plain FP8 product, then ours.
  FSDP_CHECK(fp8_shape_ok(m, n, k), ShapeError, "fp8_matmul: (", m, " x ", k, ") @ (", k, " x ",
             n, ") does not fit FP8 tensor cores (every size a multiple of 16)");
  const size_t elements = size_t(m * n);
  if (gelu) {
    void* pre = aux ? aux : scratch(elements * dtype_size(out_dtype));
    if (run(pre, out_dtype, 0.0, bias, MatmulEpilogue::None, nullptr)) {
      gelu_forward(out, pre, m * n, out_dtype, stream);
      return;
    }
  } else if (dgelu) {
    if (run(out, out_dtype, 0.0, nullptr, MatmulEpilogue::None, nullptr)) {
      gelu_backward(out, out, aux, m * n, out_dtype, stream);
      return;
    }
  } else if (out_dtype == DType::f32 && beta != 0.0) {
    // An accumulating f32 output (a weight gradient): the product in f32 scratch, added.
    void* prod = scratch(elements * sizeof(float));
    if (run(prod, DType::f32, 0.0, bias, MatmulEpilogue::None, nullptr)) {
      axpby(out, DType::f32, prod, DType::f32, 1.0, beta, m * n, stream);
      return;
    }
  }
  FSDP_THROW(ValueError, "fp8_matmul: cuBLASLt has no FP8 algorithm for (", m, " x ", k,
             ") @ (", k, " x ", n, ") ", fp8_format_name(format_a), " x ",
             fp8_format_name(format_b), " -> ", dtype_name(out_dtype),
             bias ? " with bias" : "");
}

void fp8_matmul_blocks(Blas& blas, int64_t m, int64_t n, int64_t k, void* out, DType out_dtype,
                       const uint8_t* a, Fp8Format format_a, Fp8Granularity ga, const float* sa,
                       const uint8_t* b, Fp8Format format_b, Fp8Granularity gb, const float* sb,
                       double alpha, double beta, const void* bias, void* aux,
                       MatmulEpilogue epilogue, const Scratch& scratch, stream_t stream) {
  auto run = [&](void* o, DType od, double be, const void* bi) {
    return blas.try_fp8_block_matmul(m, n, k, o, od, a, format_a, ga, sa, b, format_b, gb, sb,
                                     alpha, be, bi);
  };
  // Only the plain product and its bias are asked of cuBLASLt's block-scaled kernels;
  // GELU and its gradient are ours, after, and so is the bias where cuBLASLt offers no
  // block-scaled algorithm with it (cuBLASLt 13.1 on Hopper offers none).
  auto run_with_bias = [&](void* o, double be) {
    if (run(o, out_dtype, be, bias)) return true;
    if (!bias || !run(o, out_dtype, be, nullptr)) return false;
    add_bias_rows(m, n, o, out_dtype, bias, scratch, stream);
    return true;
  };
  if (epilogue == MatmulEpilogue::Gelu) {
    void* pre = aux ? aux : scratch(size_t(m * n) * dtype_size(out_dtype));
    if (run_with_bias(pre, 0.0)) {
      gelu_forward(out, pre, m * n, out_dtype, stream);
      return;
    }
  } else if (epilogue == MatmulEpilogue::DGelu) {
    if (run(out, out_dtype, 0.0, nullptr)) {
      gelu_backward(out, out, aux, m * n, out_dtype, stream);
      return;
    }
  } else {
    if (run_with_bias(out, beta)) return;
    if (out_dtype == DType::f32 && beta != 0.0) {
      // An accumulating f32 output (a weight gradient): the product in f32 scratch, added.
      void* prod = scratch(size_t(m * n) * sizeof(float));
      if (run(prod, DType::f32, 0.0, bias)) {
        axpby(out, DType::f32, prod, DType::f32, 1.0, beta, m * n, stream);
        return;
      }
    }
  }
  const bool rows = ga == Fp8Granularity::row;
  FSDP_THROW(ValueError, "fp8_matmul: cuBLASLt has no ", rows ? "row" : "block",
             "-scaled FP8 algorithm for (", m, " x ", k, ") @ (", k, " x ", n, ") ",
             fp8_format_name(format_a), " ", fp8_granularity_name(ga), " x ",
             fp8_format_name(format_b), " ", fp8_granularity_name(gb), " -> ",
             dtype_name(out_dtype), bias ? " with bias" : "");
}

}  // namespace fsdp::kernels::cuda
