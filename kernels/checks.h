// Argument checks and Tensor-to-raw conversions shared by the dispatch layer
// (kernels/FAMILY.cc), and the scratch memory it lends the CUDA kernels. Each check throws the typed error naming the op (`what`) and the tensor.
#pragma once

#include <cstddef>
#include <vector>

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
// Defined, on ctx's device, floating, contiguous and of n elements (any shape): the flat
// buffers of the optimizer and the initializers.
void check_flat(const Context& ctx, const Tensor& t, int64_t n, const char* what);
// Defined, on ctx's device, contiguous, of `shape` and `dtype`: the usual output check.
void check_dense(const Context& ctx, const Tensor& t, const Shape& shape, DType dtype,
                 const char* what);

// Strides of a 4-D (B, T, heads, D) tensor whose last dimension is contiguous.
kernels::HeadStrides head_strides(const Tensor& t, const char* what);

// The dtype of saved statistics: f64 for f64 compute, f32 otherwise.
inline DType stats_dtype(DType compute) { return compute == DType::f64 ? DType::f64 : DType::f32; }

// Pointer to the data of an optional tensor (nullptr when undefined).
inline void* data_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// Memory a CUDA kernel asks for on some paths only (kernels::cuda::Scratch; pass it as
// std::ref(scratch)): allocated on ctx's device when asked, and held until this object goes,
// after the op has queued its work.
class ScratchTensors {
 public:
  explicit ScratchTensors(Context& ctx) : ctx_(ctx) {}
  void* operator()(size_t bytes) {
    held_.push_back(ctx_.empty(Shape{int64_t(bytes)}, DType::u8));
    return held_.back().data_ptr();
  }

 private:
  Context& ctx_;
  std::vector<Tensor> held_;
};

}  // namespace fsdp::ops::detail
