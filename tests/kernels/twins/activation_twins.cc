// GELU and SwiGLU (kernels/cuda/activation.h) against the CPU, in bf16 and f32, at GPT-2
// 124M's MLP width and Llama's, and at odd sizes (the scalar tails of the packed loads).
#include "kernels/ops.h"
#include "runtime/core/error.h"
#include "tests/kernels/twin_harness.h"

namespace fsdp::testing {
namespace {

// Elementwise f32 math on both sides. A bf16 output carries one rounding (2^-9 relative)
// on top of it: 5e-3 of the scale. An f32 output differs only by the f32 tanh/exp of each
// side (a few ulps): 1e-5.
Tolerance activation_tolerance(DType dt) {
  return dt == DType::bf16 ? Tolerance::scaled(5e-3, "one bf16 rounding of the output")
                           : Tolerance::scaled(1e-5, "f32 tanh/exp, a few ulps apart");
}

void gelu_case(const Shape& shape, DType dt) {
  const std::string name = str_cat("gelu ", shape_name(shape), " ", dtype_name(dt));
  register_twin({"activation", name, [=](TwinSide& s) {
    // Inputs across GELU's bend and both tails.
    const Tensor x = s.random(shape, dt, 1, -6, 6);
    const Tensor y = s.empty(shape, dt);
    ops::gelu_forward(s.ctx(), y, x);
    s.output("out", y, activation_tolerance(dt));
    const Tensor dout = s.random(shape, dt, 2);
    const Tensor dx = s.empty(shape, dt);
    ops::gelu_backward(s.ctx(), dx, dout, x);
    s.output("dx", dx, activation_tolerance(dt));
  }});
}

// x (N, 2F) = [gate | up] -> out (N, F).
void swiglu_case(int64_t rows, int64_t F, DType dt) {
  const std::string name = str_cat("swiglu ", rows, "x", 2 * F, " ", dtype_name(dt));
  register_twin({"activation", name, [=](TwinSide& s) {
    const Tensor x = s.random(Shape{rows, 2 * F}, dt, 3, -4, 4);  // (N, 2F)
    const Tensor y = s.empty(Shape{rows, F}, dt);                 // (N, F)
    ops::swiglu_forward(s.ctx(), y, x);
    s.output("out", y, activation_tolerance(dt));
    const Tensor dout = s.random(Shape{rows, F}, dt, 4);
    const Tensor dx = s.empty(Shape{rows, 2 * F}, dt);
    ops::swiglu_backward(s.ctx(), dx, dout, x);
    s.output("dx", dx, activation_tolerance(dt));
  }});
}

void register_activation_twins() {
  for (DType dt : {DType::bf16, DType::f32}) {
    // GPT-2 124M's MLP activations at B*T = 4096 rows, and an odd length.
    gelu_case(Shape{4096, 3072}, dt);
    gelu_case(Shape{1001}, dt);
    // Llama's MLP, F = 11008; and an odd F.
    swiglu_case(256, 11008, dt);
    swiglu_case(256, 13, dt);
  }
}

}  // namespace
FSDP_REGISTER_TWINS(register_activation_twins)
}  // namespace fsdp::testing
