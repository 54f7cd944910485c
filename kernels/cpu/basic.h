// CPU reference kernels for the basic ops: fill, strided copy with dtype conversion,
// elementwise arithmetic and full reductions. Raw pointers and sizes only.
#pragma once

#include <cstdint>

#include "kernels/layout.h"
#include "runtime/core/dtype.h"

namespace fsdp::kernels::cpu {

void fill(void* out, DType dtype, const StridedLayout& layout, double value);
// dst[i] = convert(src[i]) for the i-th logical element of both layouts (same numel).
void copy(void* dst, DType dst_dtype, const StridedLayout& dst_layout, const void* src,
          DType src_dtype, const StridedLayout& src_layout);
// Contiguous, n elements, one dtype (floating).
// out = a op b elementwise; out and a have `dtype`, b has `b_dtype`.
void binary(BinaryOp op, void* out, const void* a, const void* b, int64_t n, DType dtype,
            DType b_dtype);
void scale(void* out, const void* a, double s, int64_t n, DType dtype);
// y = alpha * x + beta * y; x and y may have different floating dtypes.
void axpby(void* y, DType y_dtype, const void* x, DType x_dtype, double alpha, double beta,
           int64_t n);
// Reduction of n contiguous elements, accumulated in double. Max/Min of n == 0 is NaN.
double reduce(ReduceKind kind, const void* x, DType dtype, int64_t n);

}  // namespace fsdp::kernels::cpu
