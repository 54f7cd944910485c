// The fused AdamW step (kernels/cuda/adamw.h) against the CPU over three steps: against the
// double-precision reference for every moment and gradient dtype, and against the host's
// f32 AdamW (the CPU-offloaded optimizer's update) to the last bits.
#include "kernels/ops.h"
#include "runtime/core/error.h"
#include "tests/kernels/twin_harness.h"

namespace fsdp::testing {
namespace {

const int64_t kElements = (1 << 20) + 3;  // off every vector width

ops::AdamWParams adamw_params() {
  ops::AdamWParams a;
  a.lr = 3e-3;
  a.weight_decay = 0.1;
  a.grad_scale = 0.5;
  return a;
}

// The CPU reference computes in double, CUDA in f32: with f32 moments the parameters agree to
// f32 rounding of the updates (steps of ~lr = 3e-3 on O(1) weights), far below 1e-6 of the
// scale. With bf16 moments a moment near a bf16 rounding boundary may round one ulp (2^-8
// relative) apart on the two sides, moving that step's update by ~lr * 2^-7: over 3 steps at
// most ~1e-4 of the scale.
void double_reference_case(DType moments, DType grads) {
  const std::string name = str_cat("adamw_step 3 steps ", kElements, " moments ",
                                   dtype_name(moments), " grads ", dtype_name(grads));
  register_twin({"adamw", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const int64_t n = kElements;
    const Tensor p = s.random(Shape{n}, DType::f32, 15);
    // Moments and gradients in their own dtype on both sides: the CPU step reads any dtype.
    const Tensor m = ops::zeros(ctx, Shape{n}, moments), v = ops::zeros(ctx, Shape{n}, moments);
    const Tensor copy = ops::empty(ctx, Shape{n}, DType::bf16);
    ops::AdamWParams a = adamw_params();
    for (int64_t step = 1; step <= 3; ++step) {
      a.step = step;
      const Tensor g = s.random_native(Shape{n}, grads, uint32_t(20 + step));
      ops::adamw_step(ctx, p, g, m, v, a, copy);
    }
    const bool bf16 = moments == DType::bf16;
    s.output("param", p,
             bf16 ? Tolerance::scaled(1e-4, "a bf16 moment one ulp apart moves a step by lr 2^-7")
                  : Tolerance::scaled(1e-6, "f32 rounding of updates of ~lr"));
    s.output("exp_avg", m,
             bf16 ? Tolerance::scaled(1e-2, "bf16 moments: an ulp (2^-8) apart near a boundary")
                  : Tolerance::scaled(1e-5, "f32 moments computed in f32 and in double"));
    if (!s.is_reference())  // the bf16 copy is exactly CUDA's updated parameter, rounded
      s.expect(s.values(copy) == s.values(ops::cast(ctx, p, DType::bf16)),
               "the bf16 copy is the updated parameter rounded");
  }});
}

// The host's f32 AdamW on the reference side, CUDA's step on the other: both compute in f32
// with the same formula; nvcc may fuse a multiply and an add into one FMA where the host
// rounds twice, so the last bit of a few elements can differ: 1e-6 of the scale with f32
// moments. With bf16 moments such a last-bit difference can round a moment one bf16 ulp
// (2^-8 relative) apart, moving that step's update by ~lr * 2^-7: 1e-4 of the scale over 3
// steps.
void host_f32_case(DType moments) {
  const std::string name = str_cat("adamw_step against the host f32 step 3 steps ", kElements,
                                   " moments ", dtype_name(moments));
  register_twin({"adamw", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const int64_t n = kElements;
    const Tensor p = s.random(Shape{n}, DType::f32, 16);
    const Tensor m = ops::zeros(ctx, Shape{n}, moments), v = ops::zeros(ctx, Shape{n}, moments);
    const Tensor copy = ops::empty(ctx, Shape{n}, DType::bf16);
    ops::AdamWParams a = adamw_params();
    for (int64_t step = 1; step <= 3; ++step) {
      a.step = step;
      const Tensor g = s.random_native(Shape{n}, DType::bf16, uint32_t(30 + step));
      if (s.is_reference())
        ops::adamw_step_host_f32(ctx, p, g, m, v, a, copy);
      else
        ops::adamw_step(ctx, p, g, m, v, a, copy);
    }
    const bool bf16 = moments == DType::bf16;
    s.output("param", p,
             bf16 ? Tolerance::scaled(1e-4, "a last-bit difference rounds a bf16 moment apart")
                  : Tolerance::scaled(1e-6, "FMA on CUDA against two roundings on the host"));
    s.output("exp_avg", m,
             bf16 ? Tolerance::scaled(1e-2, "bf16 moments: an ulp (2^-8) apart near a boundary")
                  : Tolerance::scaled(1e-6, "f32 on both sides, FMA against two roundings"));
    s.output("bf16 copy", copy,
             Tolerance::mismatched(1e-3, "rounded from parameters equal but for a few last bits"));
  }});
}

void register_adamw_twins() {
  for (DType moments : {DType::f32, DType::bf16}) {
    for (DType grads : {DType::bf16, DType::f32}) double_reference_case(moments, grads);
  }
  for (DType moments : {DType::f32, DType::bf16}) host_f32_case(moments);
}

}  // namespace
FSDP_REGISTER_TWINS(register_adamw_twins)
}  // namespace fsdp::testing
