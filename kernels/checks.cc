#include "kernels/checks.h"

namespace fsdp::ops::detail {

kernels::StridedLayout layout_of(const Tensor& t) {
  FSDP_CHECK(t.dim() <= kernels::kMaxDims, ShapeError, t.str(), " has more than ",
             kernels::kMaxDims, " dimensions");
  kernels::StridedLayout l;
  l.rank = int(t.dim());
  for (int d = 0; d < l.rank; ++d) {
    l.shape[d] = t.shape()[d];
    l.strides[d] = t.strides()[size_t(d)];
  }
  return l;
}

void check_on_ctx(const Context& ctx, const Tensor& t, const char* what) {
  check_defined(t, what);
  FSDP_CHECK(t.device() == ctx.device(), DeviceError, what, ": ", t.str(), " is not on ",
             ctx.device().str());
}

void check_floating(const Tensor& t, const char* what) {
  FSDP_CHECK(is_floating(t.dtype()), DTypeError, what, ": floating tensor expected, got ", t.str());
}

void check_contiguous(const Tensor& t, const char* what) {
  FSDP_CHECK(t.is_contiguous(), ShapeError, what, ": ", t.str(), " must be contiguous");
}

void check_shape(const Tensor& t, const Shape& shape, const char* what) {
  FSDP_CHECK(t.shape() == shape, ShapeError, what, ": expected shape ", shape, ", got ", t.str());
}

void check_dtype(const Tensor& t, DType dtype, const char* what) {
  FSDP_CHECK(t.dtype() == dtype, DTypeError, what, ": expected dtype ", dtype_name(dtype),
             ", got ", t.str());
}

void check_flat(const Context& ctx, const Tensor& t, int64_t n, const char* what) {
  check_on_ctx(ctx, t, what);
  check_floating(t, what);
  check_contiguous(t, what);
  FSDP_CHECK(t.numel() == n, ShapeError, what, ": ", t.str(), " should hold ", n, " elements");
}

void check_dense(const Context& ctx, const Tensor& t, const Shape& shape, DType dtype,
                 const char* what) {
  check_on_ctx(ctx, t, what);
  check_shape(t, shape, what);
  check_dtype(t, dtype, what);
  check_contiguous(t, what);
}

kernels::HeadStrides head_strides(const Tensor& t, const char* what) {
  FSDP_CHECK(t.dim() == 4, ShapeError, what, ": expected a (B, T, heads, D) tensor, got ", t.str());
  FSDP_CHECK(t.stride(3) == 1 || t.size(3) == 1, ShapeError, what,
             ": the head dimension D must be contiguous (stride 1), got ", t.str());
  return kernels::HeadStrides{t.stride(0), t.stride(1), t.stride(2)};
}

}  // namespace fsdp::ops::detail
