// CUDA kernels for the basic ops (twins of kernels/cpu/basic.h). Raw pointers, sizes and a
// stream; every launch is checked. Floating math is done in f32 (f64 for f64 data).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "kernels/layout.h"
#include "runtime/core/dtype.h"

struct CUstream_st;

namespace fsdp::kernels::cuda {

using stream_t = CUstream_st*;

// Device memory that a function needs on some of its paths only (those taken when a library
// call declines the problem, or for an optional output the caller did not pass), asked of
// its caller when it takes one: `bytes` for work queued on the call's stream, valid until the
// call returns. Memory needed on every path is a workspace pointer argument instead.
using Scratch = std::function<void*(size_t bytes)>;

void fill(void* out, DType dtype, const StridedLayout& layout, double value, stream_t stream);
void copy(void* dst, DType dst_dtype, const StridedLayout& dst_layout, const void* src,
          DType src_dtype, const StridedLayout& src_layout, stream_t stream);
// out = a op b elementwise; out and a have `dtype`, b has `b_dtype`.
void binary(BinaryOp op, void* out, const void* a, const void* b, int64_t n, DType dtype,
            DType b_dtype, stream_t stream);
void scale(void* out, const void* a, double s, int64_t n, DType dtype, stream_t stream);
void axpby(void* y, DType y_dtype, const void* x, DType x_dtype, double alpha, double beta,
           int64_t n, stream_t stream);
// Writes the reduction of n contiguous elements to *result: a float on the device, or a
// double for f64 input. `workspace` holds reduce_workspace_bytes(n) bytes.
size_t reduce_workspace_bytes(int64_t n);
void reduce(ReduceKind kind, const void* x, DType dtype, int64_t n, void* result,
            void* workspace, stream_t stream);

}  // namespace fsdp::kernels::cuda
