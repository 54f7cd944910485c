#include "runtime/nn/parameter.h"

#include <utility>

#include "kernels/ops.h"

namespace fsdp::nn {

std::string InitRule::str() const {
  switch (kind) {
    case Kind::Normal: return str_cat("normal(", a, ", ", b, ")");
    case Kind::Uniform: return str_cat("uniform(", a, ", ", b, ")");
    case Kind::Zeros: return "zeros";
    case Kind::Ones: return "ones";
  }
  return "?";
}

Parameter::Parameter(std::string local_name, Shape shape, InitRule init, bool weight_decay)
    : local_name_(local_name), name_(std::move(local_name)), shape_(std::move(shape)),
      init_(init), weight_decay_(weight_decay) {
  for (int64_t d : shape_.dims())
    FSDP_CHECK(d > 0, ShapeError, "parameter ", name_, ": shape ", shape_, " has an empty dimension");
}

DType Parameter::grad_dtype() const {
  if (grad_dtype_) return *grad_dtype_;
  if (!data.defined()) return DType::f32;
  const DType d = data.dtype();
  return (d == DType::bf16 || d == DType::f16) ? DType::f32 : d;
}

Tensor& Parameter::grad_for_accumulation(Context& ctx) {
  if (!grad.defined()) {
    grad = ops::zeros(ctx, shape_, grad_dtype());
    return grad;
  }
  FSDP_CHECK(grad.shape() == shape_, ShapeError, "parameter ", name_, ": gradient ", grad.str(),
             " does not match its shape ", shape_);
  return grad;
}

void Parameter::zero_grad(Context& ctx) {
  if (grad.defined()) ops::fill(ctx, grad, 0.0);
}

void Parameter::set_placement(Placement placement) {
  FSDP_CHECK(!data.defined() && !grad.defined(), ValueError, "parameter ", name_,
             ": a placement applies to a spec, before it has data");
  const std::optional<ParallelSlice>& old = placement_.slice;
  std::optional<ParallelSlice>& slice = placement.slice;
  if (old) {
    FSDP_CHECK(slice && *slice == *old, ValueError, "parameter ", name_,
               " is already sliced (", old->str(), ")");
  } else if (slice) {
    FSDP_CHECK(slice->full_shape == shape_, ShapeError, "parameter ", name_, " ", shape_,
               ": the slice ", slice->str(), " is of another shape");
    slice->check();
    shape_ = slice->local_shape();
  }
  placement_ = std::move(placement);
}

void Parameter::set_parallel_slice(ParallelSlice slice) {
  FSDP_CHECK(!placement_.slice, ValueError, "parameter ", name_, " is already sliced (",
             placement_.slice->str(), ")");
  Placement p = placement_;
  p.slice = std::move(slice);
  set_placement(std::move(p));
}

const Tensor& Parameter::checked_data() const {
  FSDP_CHECK(data.defined(), ValueError, "parameter ", name_,
             " has no data: materialize the model (or let FSDP install its weights) first");
  FSDP_CHECK(data.shape() == shape_, ShapeError, "parameter ", name_, ": data ", data.str(),
             " does not match its shape ", shape_);
  return data;
}

}  // namespace fsdp::nn
