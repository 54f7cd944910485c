// Dispatch of the basic ops (kernels/basic.h).
#include "kernels/basic.h"

#include <cmath>
#include <cstring>

#include "kernels/checks.h"
#include "kernels/cpu/basic.h"
#include "kernels/layout.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/basic.h"
#endif

namespace fsdp::ops {
namespace {

using kernels::BinaryOp;
using kernels::ReduceKind;
using kernels::StridedLayout;

using detail::check_floating;
using detail::check_on_ctx;
using detail::layout_of;

}  // namespace

Tensor empty(Context& ctx, const Shape& shape, DType dtype) { return ctx.empty(shape, dtype); }

Tensor zeros(Context& ctx, const Shape& shape, DType dtype) { return full(ctx, shape, dtype, 0.0); }

Tensor full(Context& ctx, const Shape& shape, DType dtype, double value) {
  Tensor t = ctx.empty(shape, dtype);
  fill(ctx, t, value);
  return t;
}

Tensor from_vector(Context& ctx, const std::vector<double>& values, const Shape& shape, DType dtype) {
  return cast(ctx, from_host<double>(ctx, values, shape), dtype);
}

void fill(Context& ctx, const Tensor& out, double value) {
  check_on_ctx(ctx, out, "fill");
  if (out.device().is_cpu()) {
    kernels::cpu::fill(out.data_ptr(), out.dtype(), layout_of(out), value);
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::fill(out.data_ptr(), out.dtype(), layout_of(out), value,
                      ctx.stream().cuda_stream());
#endif
}

void copy(Context& ctx, const Tensor& dst, const Tensor& src) {
  check_defined(dst, "copy destination");
  check_defined(src, "copy source");
  FSDP_CHECK(dst.numel() == src.numel(), ShapeError, "copy: ", src.str(), " into ", dst.str(),
             ": element counts differ");
  if (dst.numel() == 0) return;
  const Device dd = dst.device(), sd = src.device();
  if (dd != sd) {
    // Across host and device: move contiguous bytes of one dtype, converting on one side.
    FSDP_CHECK(dd == ctx.device() || sd == ctx.device(), DeviceError, "copy from ", sd.str(),
               " to ", dd.str(), " on a context of ", ctx.device().str());
    Tensor staged_src = contiguous(ctx, src);
    if (dst.is_contiguous() && dst.dtype() == src.dtype()) {
      copy_bytes(dst, staged_src, ctx.stream());
      return;
    }
    // Convert where the source lives, then transfer bytes, then lay out on the destination.
    Tensor converted = src.dtype() == dst.dtype() ? staged_src : cast(ctx, staged_src, dst.dtype());
    Tensor landing = dd.is_cpu() ? ctx.empty_host(dst.shape(), dst.dtype())
                                 : ctx.empty(dst.shape(), dst.dtype());
    copy_bytes(landing, converted.view(landing.shape()), ctx.stream());
    copy(ctx, dst, landing);
    return;
  }
  if (dd.is_cpu()) {
    if (dst.is_contiguous() && src.is_contiguous() && dst.dtype() == src.dtype()) {
      std::memmove(dst.data_ptr(), src.data_ptr(), dst.nbytes());
      return;
    }
    kernels::cpu::copy(dst.data_ptr(), dst.dtype(), layout_of(dst),
                       src.data_ptr(), src.dtype(), layout_of(src));
    return;
  }
  check_on_ctx(ctx, dst, "copy destination");
#if FSDP_WITH_CUDA
  kernels::cuda::copy(dst.data_ptr(), dst.dtype(), layout_of(dst),
                      src.data_ptr(), src.dtype(), layout_of(src), ctx.stream().cuda_stream());
#endif
}

Tensor contiguous(Context& ctx, const Tensor& t) {
  check_defined(t, "contiguous");
  if (t.is_contiguous()) return t;
  Tensor out = t.device().is_cpu() ? ctx.empty_host(t.shape(), t.dtype()) : ctx.empty(t.shape(), t.dtype());
  copy(ctx, out, t);
  return out;
}

Tensor cast(Context& ctx, const Tensor& t, DType dtype) {
  check_defined(t, "cast");
  Tensor out = t.device().is_cpu() ? ctx.empty_host(t.shape(), dtype) : ctx.empty(t.shape(), dtype);
  copy(ctx, out, t);
  return out;
}

Tensor clone(Context& ctx, const Tensor& t) { return cast(ctx, t, t.dtype()); }

Tensor to_device(Context& ctx, const Tensor& t, Device device) {
  check_defined(t, "to_device");
  FSDP_CHECK(device.is_cpu() || device == ctx.device(), DeviceError, "to_device(", device.str(),
             ") on a context of ", ctx.device().str());
  Tensor out = device.is_cpu() ? ctx.empty_host(t.shape(), t.dtype()) : ctx.empty(t.shape(), t.dtype());
  copy(ctx, out, t);
  return out;
}

Tensor to_host(Context& ctx, const Tensor& t) {
  if (t.device().is_cpu()) return t;
  return to_device(ctx, t, Device::cpu());
}

Tensor reshape(Context& ctx, const Tensor& t, const Shape& shape) {
  return contiguous(ctx, t).view(shape);
}

// ---------------------------------------------------------------- elementwise

namespace {

void binary_op(Context& ctx, BinaryOp op, const char* what, const Tensor& out, const Tensor& a,
               const Tensor& b) {
  check_on_ctx(ctx, out, what);
  check_on_ctx(ctx, a, what);
  check_on_ctx(ctx, b, what);
  check_same_shape(a, b, what);
  check_same_shape(out, a, what);
  check_same_dtype(out, a, what);
  check_floating(a, what);
  check_floating(b, what);
  FSDP_CHECK(out.is_contiguous(), ShapeError, what, ": output must be contiguous, got ", out.str());
  const Tensor ac = contiguous(ctx, a), bc = contiguous(ctx, b);
  if (out.device().is_cpu()) {
    kernels::cpu::binary(op, out.data_ptr(), ac.data_ptr(), bc.data_ptr(), out.numel(), out.dtype(),
                         b.dtype());
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::binary(op, out.data_ptr(), ac.data_ptr(), bc.data_ptr(), out.numel(), out.dtype(),
                        b.dtype(), ctx.stream().cuda_stream());
#endif
}

}  // namespace

void add(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b) {
  binary_op(ctx, BinaryOp::Add, "add", out, a, b);
}
void sub(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b) {
  binary_op(ctx, BinaryOp::Sub, "sub", out, a, b);
}
void mul(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b) {
  binary_op(ctx, BinaryOp::Mul, "mul", out, a, b);
}

void scale(Context& ctx, const Tensor& out, const Tensor& a, double s) {
  check_on_ctx(ctx, out, "scale");
  check_on_ctx(ctx, a, "scale");
  check_same_shape(out, a, "scale");
  check_same_dtype(out, a, "scale");
  check_floating(a, "scale");
  FSDP_CHECK(out.is_contiguous(), ShapeError, "scale: output must be contiguous, got ", out.str());
  const Tensor ac = contiguous(ctx, a);
  if (out.device().is_cpu()) {
    kernels::cpu::scale(out.data_ptr(), ac.data_ptr(), s, out.numel(), out.dtype());
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::scale(out.data_ptr(), ac.data_ptr(), s, out.numel(), out.dtype(),
                       ctx.stream().cuda_stream());
#endif
}

void axpby(Context& ctx, const Tensor& y, double alpha, const Tensor& x, double beta) {
  check_on_ctx(ctx, y, "axpby");
  check_on_ctx(ctx, x, "axpby");
  FSDP_CHECK(y.numel() == x.numel(), ShapeError, "axpby: ", x.str(), " into ", y.str(),
             ": element counts differ");
  check_floating(x, "axpby");
  check_floating(y, "axpby");
  FSDP_CHECK(y.is_contiguous(), ShapeError, "axpby: y must be contiguous, got ", y.str());
  const Tensor xc = contiguous(ctx, x);
  if (y.device().is_cpu()) {
    kernels::cpu::axpby(y.data_ptr(), y.dtype(), xc.data_ptr(), x.dtype(), alpha, beta, y.numel());
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::axpby(y.data_ptr(), y.dtype(), xc.data_ptr(), x.dtype(), alpha, beta, y.numel(),
                       ctx.stream().cuda_stream());
#endif
}

// ---------------------------------------------------------------- reductions

namespace {

Tensor reduce(Context& ctx, ReduceKind kind, const Tensor& t, const char* what) {
  check_on_ctx(ctx, t, what);
  check_floating(t, what);
  const Tensor tc = contiguous(ctx, t);
  const DType out_dtype = t.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor out = ctx.empty(Shape{}, out_dtype);
  if (t.device().is_cpu()) {
    const double r = kernels::cpu::reduce(kind, tc.data_ptr(), tc.dtype(), tc.numel());
    kernels::cpu::fill(out.data_ptr(), out_dtype, layout_of(out), r);
    return out;
  }
#if FSDP_WITH_CUDA
  Tensor workspace = ctx.empty(
      Shape{int64_t(kernels::cuda::reduce_workspace_bytes(tc.numel()))}, DType::u8);
  kernels::cuda::reduce(kind, tc.data_ptr(), tc.dtype(), tc.numel(), out.data_ptr(),
                        workspace.data_ptr(), ctx.stream().cuda_stream());
#endif
  return out;
}

}  // namespace

Tensor sum(Context& ctx, const Tensor& t) { return reduce(ctx, ReduceKind::Sum, t, "sum"); }
Tensor sum_squares(Context& ctx, const Tensor& t) {
  return reduce(ctx, ReduceKind::SumSquares, t, "sum_squares");
}
Tensor max(Context& ctx, const Tensor& t) { return reduce(ctx, ReduceKind::Max, t, "max"); }
Tensor min(Context& ctx, const Tensor& t) { return reduce(ctx, ReduceKind::Min, t, "min"); }
Tensor max_abs(Context& ctx, const Tensor& t) { return reduce(ctx, ReduceKind::MaxAbs, t, "max_abs"); }

double item(Context& ctx, const Tensor& t) { return to_host(ctx, t).item(); }

Difference compare(Context& ctx, const Tensor& a, const Tensor& b, double rel_floor) {
  check_same_shape(a, b, "compare");
  const std::vector<double> x = to_vector<double>(ctx, cast(ctx, to_host(ctx, a), DType::f64));
  const std::vector<double> y = to_vector<double>(ctx, cast(ctx, to_host(ctx, b), DType::f64));
  Difference d;
  for (size_t i = 0; i < x.size(); ++i) {
    const double diff = std::fabs(x[i] - y[i]);
    if (std::isnan(diff) && !(std::isnan(x[i]) && std::isnan(y[i]))) {
      d.max_abs = d.max_rel = INFINITY;
      continue;
    }
    if (std::isnan(diff)) continue;
    d.max_abs = std::max(d.max_abs, diff);
    d.max_rel = std::max(d.max_rel, diff / std::max(std::fabs(y[i]), rel_floor));
  }
  return d;
}

}  // namespace fsdp::ops
