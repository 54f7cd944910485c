// StridedLayout: shape and element strides of a tensor, as a plain value that raw kernels
// (CPU and CUDA alike) take by value, so they never depend on Tensor.
#pragma once

#include <cstdint>

#include "runtime/core/error.h"

namespace fsdp::kernels {

constexpr int kMaxDims = 8;

struct StridedLayout {
  int rank = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < rank; ++d) n *= shape[d];
    return n;
  }
  // Element offset of the i-th element in row-major (logical) order.
#if defined(__CUDACC__)
  __host__ __device__
#endif
  int64_t offset_of(int64_t i) const {
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t idx = i % shape[d];
      i /= shape[d];
      off += idx * strides[d];
    }
    return off;
  }
};

// Enumerates the kinds of elementwise and reduction kernels shared by both backends.
enum class BinaryOp : uint8_t { Add, Sub, Mul };
enum class ReduceKind : uint8_t { Sum, SumSquares, Max, Min, MaxAbs };

}  // namespace fsdp::kernels
