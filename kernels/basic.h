// Creation, fill, copy and cast, elementwise arithmetic and full reductions at the Tensor
// level (kernels/ops.h has the conventions): kernels/basic.cc routes them to
// kernels/cpu/basic.h or kernels/cuda/basic.h.
//
// Element types: floating kernels take f32, f64, bf16 and f16 (bf16/f16 computed in f32);
// fill, copy and cast take every dtype.
#pragma once

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp::ops {

// ---- creation
Tensor empty(Context& ctx, const Shape& shape, DType dtype);
Tensor zeros(Context& ctx, const Shape& shape, DType dtype);
Tensor full(Context& ctx, const Shape& shape, DType dtype, double value);
// A tensor on ctx's device holding `values` (converted to `dtype`).
Tensor from_vector(Context& ctx, const std::vector<double>& values, const Shape& shape, DType dtype);
template <typename T>
Tensor from_host(Context& ctx, const std::vector<T>& values, const Shape& shape);

// ---- fill, copy, cast, transfer
void fill(Context& ctx, const Tensor& out, double value);  // any layout
// dst <- src elementwise: any strides on either side, any dtypes (converted with
// round-to-nearest-even), any devices (host <-> device through a contiguous staging copy).
void copy(Context& ctx, const Tensor& dst, const Tensor& src);
Tensor contiguous(Context& ctx, const Tensor& t);  // t itself when already contiguous
Tensor cast(Context& ctx, const Tensor& t, DType dtype);  // new contiguous tensor
Tensor clone(Context& ctx, const Tensor& t);
// A contiguous copy on `device` (host or ctx's device). Copies to the host complete before
// returning.
Tensor to_device(Context& ctx, const Tensor& t, Device device);
Tensor to_host(Context& ctx, const Tensor& t);
// Reshape: a view when t is contiguous, otherwise a contiguous copy viewed as `shape`.
Tensor reshape(Context& ctx, const Tensor& t, const Shape& shape);

// ---- elementwise (same shapes; any strides on the inputs, `out` may alias an input)
// out = a (op) b elementwise: out and a share a floating dtype; b may have another (an f32
// residual stream plus a bf16 branch), read at a's precision.
void add(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b);  // out = a + b
void sub(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b);  // out = a - b
void mul(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b);  // out = a * b
void scale(Context& ctx, const Tensor& out, const Tensor& a, double s);       // out = s * a
// y = alpha * x + beta * y  (y may be a wider dtype than x: accumulate bf16 into f32)
void axpby(Context& ctx, const Tensor& y, double alpha, const Tensor& x, double beta = 1.0);

// ---- full reductions into a one-element f32 tensor (f64 for f64 inputs) on t's device.
// Accumulation is in f64 on the CPU and f32 (pairwise per block) on CUDA.
Tensor sum(Context& ctx, const Tensor& t);
Tensor sum_squares(Context& ctx, const Tensor& t);
Tensor max(Context& ctx, const Tensor& t);
Tensor min(Context& ctx, const Tensor& t);
Tensor max_abs(Context& ctx, const Tensor& t);
// Reads a one-element tensor back to the host (synchronizes).
double item(Context& ctx, const Tensor& t);
// Largest |a - b| and largest |a - b| / max(|b|, floor), for tests comparing backends.
struct Difference {
  double max_abs = 0;
  double max_rel = 0;
};
Difference compare(Context& ctx, const Tensor& a, const Tensor& b, double rel_floor = 1e-6);

// ---- host helpers
template <typename T>
std::vector<T> to_vector(Context& ctx, const Tensor& t) {
  return contiguous(ctx, to_host(ctx, t)).template to_vector<T>();
}

template <typename T>
Tensor from_host(Context& ctx, const std::vector<T>& values, const Shape& shape) {
  FSDP_CHECK(int64_t(values.size()) == shape.numel(), ShapeError, "from_host: ", values.size(),
             " values for shape ", shape);
  Tensor host = ctx.empty_host(shape, dtype_of<T>());
  std::copy(values.begin(), values.end(), host.data<T>());
  if (ctx.device().is_cpu()) return host;
  return to_device(ctx, host, ctx.device());
}

}  // namespace fsdp::ops
