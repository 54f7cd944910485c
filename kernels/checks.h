// Argument checks and Tensor-to-raw conversions shared by the dispatch layer (ops.cc and
// nn_ops_*.cc). Each check throws the typed error naming the op (`what`) and the tensor.
#pragma once

#include "kernels/layout.h"
#include "kernels/nn_shapes.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp::ops::detail {

kernels::StridedLayout layout_of(const Tensor& t);

void check_on_ctx(const Context& ctx, const Tensor& t, const char* what);
void check_floating(const Tensor& t, const char* what);
void check_contiguous(const Tensor& t, const char* what);
void check_shape(const Tensor& t, const Shape& shape, const char* what);
void check_dtype(const Tensor& t, DType dtype, const char* what);
// Defined, on ctx's device, contiguous, of `shape` and `dtype`: the usual output check.
void check_dense(const Context& ctx, const Tensor& t, const Shape& shape, DType dtype,
                 const char* what);

// Strides of a 4-D (B, T, heads, D) tensor whose last dimension is contiguous.
kernels::HeadStrides head_strides(const Tensor& t, const char* what);

// The dtype of saved statistics: f64 for f64 compute, f32 otherwise.
inline DType stats_dtype(DType compute) { return compute == DType::f64 ? DType::f64 : DType::f32; }

// Pointer to the data of an optional tensor (nullptr when undefined).
inline void* data_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

}  // namespace fsdp::ops::detail
