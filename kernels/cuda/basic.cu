#include "kernels/cuda/basic.h"

#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vec.cuh"

namespace fsdp::kernels::cuda {
namespace {

constexpr int kBlock = 256;

template <typename T>
__global__ void fill_kernel(T* out, StridedLayout layout, int64_t n, T value, bool contiguous) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[contiguous ? i : layout.offset_of(i)] = value;
}

template <typename D, typename S>
__global__ void copy_kernel(D* dst, StridedLayout dl, const S* src, StridedLayout sl, int64_t n,
                            bool dst_contig, bool src_contig) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const S v = src[src_contig ? i : sl.offset_of(i)];
    dst[dst_contig ? i : dl.offset_of(i)] = from_double_dev<D>(to_double_dev(v));
  }
}

// Same-type copies skip the double round trip (and so copy NaN payloads bit for bit).
template <typename T>
__global__ void copy_same_kernel(T* dst, StridedLayout dl, const T* src, StridedLayout sl,
                                 int64_t n, bool dst_contig, bool src_contig) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[dst_contig ? i : dl.offset_of(i)] = src[src_contig ? i : sl.offset_of(i)];
}

// A same-type strided copy whose last dimension is contiguous on both sides, as rows of
// `packs` 16-byte packs: `outer` lays out the rows (the other dimensions) of each side, so the
// index arithmetic runs once per pack instead of once per element (views of fused
// projections, the parallel layers' packed exchanges).
template <typename T>
__global__ void copy_rows_kernel(T* dst, StridedLayout dst_outer, const T* src,
                                 StridedLayout src_outer, int64_t rows, int64_t packs) {
  constexpr int kP = Pack<T>::kSize;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < rows * packs;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = k / packs, col = (k % packs) * kP;
    store_pack(dst + dst_outer.offset_of(row) + col, load_pack(src + src_outer.offset_of(row) + col));
  }
}

// dst (rows, cols) contiguous = src read column-major (element (r, c) at src[r + c * ld]): the
// transposed view of a (cols, ld) matrix made contiguous. A (32, 32) tile passes through
// shared memory (a padded row, so the column reads hit distinct banks), so both the global
// reads and the writes run along rows.
constexpr int kTransposeTile = 32, kTransposeRows = 8;
template <typename T>
__global__ void transpose_kernel(T* dst, const T* src, int64_t rows, int64_t cols, int64_t ld) {
  constexpr int kPitch = kTransposeTile + 1;
  __shared__ alignas(T) unsigned char storage[kTransposeTile * kPitch * sizeof(T)];
  T* tile = reinterpret_cast<T*>(storage);  // [kTransposeTile][kPitch]
  const int64_t r0 = int64_t(blockIdx.y) * kTransposeTile, c0 = int64_t(blockIdx.x) * kTransposeTile;
  // Read: consecutive threads take consecutive r (contiguous in src).
  for (int j = threadIdx.y; j < kTransposeTile; j += kTransposeRows) {
    const int64_t r = r0 + threadIdx.x, c = c0 + j;
    if (r < rows && c < cols) tile[j * kPitch + threadIdx.x] = src[r + c * ld];
  }
  __syncthreads();
  // Write: consecutive threads take consecutive c (contiguous in dst).
  for (int j = threadIdx.y; j < kTransposeTile; j += kTransposeRows) {
    const int64_t r = r0 + j, c = c0 + threadIdx.x;
    if (r < rows && c < cols) dst[r * cols + c] = tile[threadIdx.x * kPitch + j];
  }
}

// The rows of l (all but its last dimension) when that dimension is contiguous and it and
// every other stride are whole 16-byte packs of `element` bytes; rank 0 otherwise.
StridedLayout outer_rows(const StridedLayout& l, size_t element) {
  StridedLayout outer;
  if (l.rank < 2 || l.strides[l.rank - 1] != 1 || (l.shape[l.rank - 1] * element) % 16 != 0)
    return outer;
  for (int d = 0; d + 1 < l.rank; ++d) {
    if ((l.strides[d] * element) % 16 != 0) return StridedLayout{};
    outer.shape[d] = l.shape[d];
    outer.strides[d] = l.strides[d];
  }
  outer.rank = l.rank - 1;
  return outer;
}

bool is_contiguous(const StridedLayout& l) {
  int64_t expected = 1;
  for (int d = l.rank - 1; d >= 0; --d) {
    if (l.shape[d] != 1 && l.strides[d] != expected) return false;
    expected *= l.shape[d];
  }
  return true;
}

template <typename T, typename U>
__global__ void binary_kernel(BinaryOp op, T* out, const T* a, const U* b, int64_t n) {
  using C = typename ComputeOf<T>::type;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const C u = C(to_double_dev(a[i])), v = C(to_double_dev(b[i]));
    const C r = op == BinaryOp::Add ? u + v : op == BinaryOp::Sub ? u - v : u * v;
    out[i] = from_double_dev<T>(r);
  }
}

// The same for float-computed types (f32, bf16, f16) on 16-byte aligned buffers, W elements
// per thread with 128-bit loads and stores: the residual add runs at memory speed. Same
// roundings as binary_kernel (one float operation, rounded once).
template <int W, typename T, typename U>
__global__ void binary_packed_kernel(BinaryOp op, T* out, const T* a, const U* b, int64_t n) {
  for (int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * W; i < n;
       i += int64_t(gridDim.x) * blockDim.x * W) {
    float u[W], v[W], r[W];
    load_floats<W>(a + i, u);
    load_floats<W>(b + i, v);
#pragma unroll
    for (int j = 0; j < W; ++j)
      r[j] = op == BinaryOp::Add ? u[j] + v[j] : op == BinaryOp::Sub ? u[j] - v[j] : u[j] * v[j];
    store_floats<W>(out + i, r);
  }
}

template <typename T>
__global__ void scale_kernel(T* out, const T* a, double s, int64_t n) {
  using C = typename ComputeOf<T>::type;
  const C sc = C(s);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_double_dev<T>(sc * C(to_double_dev(a[i])));
}

template <typename Y, typename X, typename C>
__global__ void axpby_kernel(Y* y, const X* x, C alpha, C beta, int64_t n, bool beta_zero) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const C xi = C(to_double_dev(x[i]));
    const C r = beta_zero ? alpha * xi : alpha * xi + beta * C(to_double_dev(y[i]));
    y[i] = from_double_dev<Y>(r);
  }
}

// ---- reductions: each block reduces a grid-strided part into partials[blockIdx.x]; one
// final block reduces the partials. A = accumulation type (float, or double for f64).

template <typename A>
__device__ __forceinline__ A combine(ReduceKind k, A acc, A v) {
  switch (k) {
    case ReduceKind::Sum: return acc + v;
    case ReduceKind::SumSquares: return acc + v;  // v is already squared
    case ReduceKind::Max: return (isnan(acc) || isnan(v)) ? A(NAN) : (v > acc ? v : acc);
    case ReduceKind::Min: return (isnan(acc) || isnan(v)) ? A(NAN) : (v < acc ? v : acc);
    case ReduceKind::MaxAbs: return (isnan(acc) || isnan(v)) ? A(NAN) : (v > acc ? v : acc);
  }
  return acc;
}

template <typename A>
__device__ __forceinline__ A identity(ReduceKind k) {
  switch (k) {
    case ReduceKind::Max: return A(-INFINITY);
    case ReduceKind::Min: return A(INFINITY);
    default: return A(0);
  }
}

template <typename A>
__device__ A block_reduce(ReduceKind k, A v) {
  __shared__ A shared[kBlock];
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] = combine(k, shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  return shared[0];
}

template <typename T, typename A>
__global__ void reduce_partial_kernel(ReduceKind k, const T* x, int64_t n, A* partials) {
  A acc = identity<A>(k);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    A v = A(to_double_dev(x[i]));
    if (k == ReduceKind::SumSquares) v = v * v;
    if (k == ReduceKind::MaxAbs) v = v < A(0) ? -v : v;
    acc = combine(k, acc, v);
  }
  const A r = block_reduce(k, acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = r;
}

template <typename A>
__global__ void reduce_final_kernel(ReduceKind k, const A* partials, int n, A* result, bool empty) {
  A acc = identity<A>(k);
  for (int i = threadIdx.x; i < n; i += blockDim.x) acc = combine(k, acc, partials[i]);
  const A r = block_reduce(k, acc);
  if (threadIdx.x == 0) {
    const bool extremum = k == ReduceKind::Max || k == ReduceKind::Min || k == ReduceKind::MaxAbs;
    *result = (empty && extremum) ? A(NAN) : r;  // as on the CPU: no extremum of nothing
  }
}

constexpr int kReduceBlocks = 1024;

}  // namespace

void fill(void* out, DType dtype, const StridedLayout& layout, double value, stream_t stream) {
  const int64_t n = layout.numel();
  if (n == 0) return;
  // +0 is all zero bits in every dtype: contiguous zeros (gradients cleared every step) go
  // through the driver's memset, at the copy's bandwidth.
  if (value == 0.0 && !std::signbit(value) && is_contiguous(layout)) {
    FSDP_CALL(cudaMemsetAsync(out, 0, size_t(n) * dtype_size(dtype), stream));
    return;
  }
  dispatch_device_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T v = [&] {
      if constexpr (std::is_same_v<T, bf16_t>) return bf16_t(__float2bfloat16_rn(float(value)));
      else if constexpr (std::is_same_v<T, f16_t>) return f16_t(__float2half_rn(float(value)));
      else return T(value);
    }();
    fill_kernel<T><<<grid_for(n, kBlock), kBlock, 0, stream>>>(static_cast<T*>(out), layout, n, v,
                                                              is_contiguous(layout));
    FSDP_CHECK_LAUNCH();
  });
}

void copy(void* dst, DType dst_dtype, const StridedLayout& dst_layout, const void* src,
          DType src_dtype, const StridedLayout& src_layout, stream_t stream) {
  const int64_t n = dst_layout.numel();
  FSDP_ASSERT(n == src_layout.numel());
  if (n == 0) return;
  const bool dc = is_contiguous(dst_layout), sc = is_contiguous(src_layout);
  if (dst_dtype == src_dtype) {
    if (dc && sc) {
      FSDP_CALL(cudaMemcpyAsync(dst, src, size_t(n) * dtype_size(dst_dtype),
                                cudaMemcpyDeviceToDevice, stream));
      return;
    }
    const size_t element = dtype_size(dst_dtype);
    const StridedLayout dst_rows = outer_rows(dst_layout, element);
    const StridedLayout src_rows = outer_rows(src_layout, element);
    const int64_t last = dst_layout.rank > 0 ? dst_layout.shape[dst_layout.rank - 1] : 0;
    const bool by_rows = dst_rows.rank > 0 && src_rows.rank > 0 && aligned16(dst) &&
                         aligned16(src) && src_layout.shape[src_layout.rank - 1] == last;
    // A 2-D transpose into a contiguous matrix (a transposed weight's bytes, say).
    const bool transpose = dc && dst_layout.rank == 2 && src_layout.rank == 2 &&
                           src_layout.shape[0] == dst_layout.shape[0] &&
                           src_layout.strides[0] == 1 && src_layout.shape[0] > 1 &&
                           src_layout.strides[1] >= src_layout.shape[0] &&
                           dst_layout.shape[0] < 65535 * int64_t(kTransposeTile);
    dispatch_device_dtype(dst_dtype, [&](auto tag) {
      using T = decltype(tag);
      if (transpose) {
        const int64_t rows = dst_layout.shape[0], cols = dst_layout.shape[1];
        const dim3 grid(unsigned((cols + kTransposeTile - 1) / kTransposeTile),
                        unsigned((rows + kTransposeTile - 1) / kTransposeTile));
        transpose_kernel<T><<<grid, dim3(kTransposeTile, kTransposeRows), 0, stream>>>(
            static_cast<T*>(dst), static_cast<const T*>(src), rows, cols, src_layout.strides[1]);
        FSDP_CHECK_LAUNCH();
        return;
      }
      if (by_rows) {
        const int64_t rows = n / last, packs = last / Pack<T>::kSize;
        copy_rows_kernel<T><<<grid_for(rows * packs, kBlock), kBlock, 0, stream>>>(
            static_cast<T*>(dst), dst_rows, static_cast<const T*>(src), src_rows, rows, packs);
        FSDP_CHECK_LAUNCH();
        return;
      }
      copy_same_kernel<T><<<grid_for(n, kBlock), kBlock, 0, stream>>>(
          static_cast<T*>(dst), dst_layout, static_cast<const T*>(src), src_layout, n, dc, sc);
      FSDP_CHECK_LAUNCH();
    });
    return;
  }
  dispatch_device_dtype(dst_dtype, [&](auto dtag) {
    using D = decltype(dtag);
    dispatch_device_dtype(src_dtype, [&](auto stag) {
      using S = decltype(stag);
      copy_kernel<D, S><<<grid_for(n, kBlock), kBlock, 0, stream>>>(
          static_cast<D*>(dst), dst_layout, static_cast<const S*>(src), src_layout, n, dc, sc);
      FSDP_CHECK_LAUNCH();
    });
  });
}

void binary(BinaryOp op, void* out, const void* a, const void* b, int64_t n, DType dtype,
            DType b_dtype, stream_t stream) {
  if (n == 0) return;
  dispatch_device_floating(dtype, "binary", [&](auto tag) {
    using T = decltype(tag);
    dispatch_device_floating(b_dtype, "binary", [&](auto btag) {
      using U = decltype(btag);
      constexpr int kW = 8;  // a whole number of 128-bit packs of f32 (4) and of bf16 (8)
      if constexpr (!std::is_same_v<T, double> && !std::is_same_v<U, double>) {
        if (n % kW == 0 && aligned16(out) && aligned16(a) && aligned16(b)) {
          binary_packed_kernel<kW, T, U><<<grid_for(n / kW, kBlock), kBlock, 0, stream>>>(
              op, static_cast<T*>(out), static_cast<const T*>(a), static_cast<const U*>(b), n);
          FSDP_CHECK_LAUNCH();
          return;
        }
      }
      binary_kernel<T, U><<<grid_for(n, kBlock), kBlock, 0, stream>>>(
          op, static_cast<T*>(out), static_cast<const T*>(a), static_cast<const U*>(b), n);
      FSDP_CHECK_LAUNCH();
    });
  });
}

void scale(void* out, const void* a, double s, int64_t n, DType dtype, stream_t stream) {
  if (n == 0) return;
  dispatch_device_floating(dtype, "scale", [&](auto tag) {
    using T = decltype(tag);
    scale_kernel<T><<<grid_for(n, kBlock), kBlock, 0, stream>>>(static_cast<T*>(out),
                                                               static_cast<const T*>(a), s, n);
    FSDP_CHECK_LAUNCH();
  });
}

void axpby(void* y, DType y_dtype, const void* x, DType x_dtype, double alpha, double beta,
           int64_t n, stream_t stream) {
  if (n == 0) return;
  dispatch_device_floating(y_dtype, "axpby", [&](auto ytag) {
    using Y = decltype(ytag);
    dispatch_device_floating(x_dtype, "axpby", [&](auto xtag) {
      using X = decltype(xtag);
      if constexpr (std::is_same_v<X, double> || std::is_same_v<Y, double>) {
        axpby_kernel<Y, X, double><<<grid_for(n, kBlock), kBlock, 0, stream>>>(
            static_cast<Y*>(y), static_cast<const X*>(x), alpha, beta, n, beta == 0.0);
      } else {
        axpby_kernel<Y, X, float><<<grid_for(n, kBlock), kBlock, 0, stream>>>(
            static_cast<Y*>(y), static_cast<const X*>(x), float(alpha), float(beta), n,
            beta == 0.0);
      }
      FSDP_CHECK_LAUNCH();
    });
  });
}

size_t reduce_workspace_bytes(int64_t) { return kReduceBlocks * sizeof(double); }

void reduce(ReduceKind kind, const void* x, DType dtype, int64_t n, void* result, void* workspace,
            stream_t stream) {
  dispatch_device_floating(dtype, "reduce", [&](auto tag) {
    using T = decltype(tag);
    using A = typename ComputeOf<T>::type;
    const int blocks = int(grid_for(n, kBlock, kReduceBlocks));
    A* partials = static_cast<A*>(workspace);
    reduce_partial_kernel<T, A><<<blocks, kBlock, 0, stream>>>(kind, static_cast<const T*>(x), n,
                                                               partials);
    FSDP_CHECK_LAUNCH();
    reduce_final_kernel<A><<<1, kBlock, 0, stream>>>(kind, partials, blocks,
                                                      static_cast<A*>(result), n == 0);
    FSDP_CHECK_LAUNCH();
  });
}

}  // namespace fsdp::kernels::cuda
