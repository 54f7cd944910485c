#include "runtime/nn/init.h"

#include "kernels/ops.h"

namespace fsdp::nn {

namespace {

// Elements [offset, offset + out.numel()) of the FULL parameter's flattening.
void init_full_range(Context& ctx, const Parameter& param, uint64_t seed, int64_t offset,
                     const Tensor& out) {
  const InitRule& rule = param.init();
  switch (rule.kind) {
    case InitRule::Kind::Normal:
      ops::init_normal(ctx, out, seed, ops::name_key(param.name()), offset, rule.a, rule.b);
      return;
    case InitRule::Kind::Uniform:
      ops::init_uniform(ctx, out, seed, ops::name_key(param.name()), offset, rule.a, rule.b);
      return;
    case InitRule::Kind::Zeros:
      ops::fill(ctx, out, 0.0);
      return;
    case InitRule::Kind::Ones:
      ops::fill(ctx, out, 1.0);
      return;
  }
}

}  // namespace

void init_parameter_range(Context& ctx, const Parameter& param, uint64_t seed, int64_t offset,
                          const Tensor& out) {
  check_defined(out, "init_parameter_range: out");
  FSDP_CHECK(out.is_contiguous() && is_floating(out.dtype()), ValueError,
             "init_parameter_range(", param.name(), "): out must be a contiguous floating tensor, got ",
             out.str());
  FSDP_CHECK(offset >= 0 && offset + out.numel() <= param.numel(), IndexError,
             "init_parameter_range(", param.name(), "): elements [", offset, ", ",
             offset + out.numel(), ") are outside its ", param.numel(), " elements");
  if (out.numel() == 0) return;
  if (!param.parallel_slice()) return init_full_range(ctx, param, seed, offset, out);
  // A tensor-parallel slice: each run of local elements is a run of the full parameter's,
  // so the slice initializes to exactly those elements of the full initialization.
  const Tensor flat = out.flatten();
  for (const ParallelSlice::Run& r : param.parallel_slice()->runs(offset, out.numel()))
    init_full_range(ctx, param, seed, r.full, flat.narrow(0, r.local - offset, r.numel));
}

void materialize(Context& ctx, Module& model, DType dtype, uint64_t seed) {
  FSDP_CHECK(is_floating(dtype), DTypeError, "materialize: parameters need a floating dtype, got ",
             dtype_name(dtype));
  for (Parameter* p : model.named_parameters()) {
    p->data = ctx.empty(p->shape(), dtype);
    init_parameter_range(ctx, *p, seed, 0, p->data.flatten());
    p->grad = Tensor();
  }
}

void set_grad_dtype(Module& model, DType dtype) {
  FSDP_CHECK(is_floating(dtype), DTypeError, "set_grad_dtype: floating dtype expected, got ",
             dtype_name(dtype));
  for (Parameter* p : model.named_parameters()) p->set_grad_dtype(dtype);
}

void zero_grad(Context& ctx, Module& model) {
  for (Parameter* p : model.named_parameters()) p->zero_grad(ctx);
}

void release_grads(Module& model) {
  for (Parameter* p : model.named_parameters()) p->grad = Tensor();
}

}  // namespace fsdp::nn
