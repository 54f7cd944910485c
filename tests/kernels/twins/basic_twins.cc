// The basic ops (kernels/cuda/basic.h) against the CPU, which runs them in every dtype:
// elementwise arithmetic, strided copies and casts, full reductions, axpby, fills through
// views, and the f32 residual stream plus a bf16 branch. Inputs are in the dtype under test
// on both sides (random_native).
#include <cmath>

#include "kernels/ops.h"
#include "runtime/core/error.h"
#include "tests/kernels/twin_harness.h"

namespace fsdp::testing {
namespace {

// Elementwise results are computed in the same precision on both sides: exactly equal.
const Tolerance kSamePrecision = Tolerance::exact("computed in the same precision on both sides");

void elementwise_and_reductions_case(DType dt) {
  const std::string name =
      str_cat("add sub mul scale copy cast and reductions 1024x1024 ", dtype_name(dt));
  register_twin({"basic", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const Shape shape{1024, 1024};
    // Values in [-2, 2): signs, and magnitudes across a binade boundary.
    const Tensor a = s.random_native(shape, dt, 1, -2, 2), b = s.random_native(shape, dt, 2, -2, 2);
    const Tensor out = ops::empty(ctx, shape, dt);
    ops::add(ctx, out, a, b);
    s.output("add", out, kSamePrecision);
    ops::sub(ctx, out, a, b);
    s.output("sub", out, kSamePrecision);
    ops::mul(ctx, out, a, b);
    s.output("mul", out, kSamePrecision);
    ops::scale(ctx, out, a, 0.37);
    s.output("scale", out, kSamePrecision);
    // Transposed copies and casts.
    s.output("contiguous(a^T)", ops::contiguous(ctx, a.transpose(0, 1)),
             Tolerance::exact("a copy"));
    for (DType to : {DType::f32, DType::bf16, DType::f16, DType::i32}) {
      s.output(str_cat("cast to ", dtype_name(to)), ops::cast(ctx, a, to),
               Tolerance::exact("one rounding (to nearest even) on both sides"));
    }
    // The CPU accumulates in f64, CUDA in f32 (f64 for f64 input).
    const bool f64 = dt == DType::f64;
    const double n = double(shape.numel());
    s.output("sum_squares", ops::sum_squares(ctx, a),
             f64 ? Tolerance::scaled(1e-12, "f64 sums in another order")
                 : Tolerance::scaled(1e-5, "f32 sums of 2^20 positive terms against f64"));
    // Signed terms: the sum may be near 0, so its bound is absolute, 1e-5 (1e-12) per term.
    s.output("sum", ops::sum(ctx, a),
             f64 ? Tolerance::absolute(1e-12 * n, "f64 sums in another order")
                 : Tolerance::absolute(1e-5 * n, "f32 sums of 2^20 terms against f64"));
    s.output("max", ops::max(ctx, a), Tolerance::exact("an element of a"));
    s.output("min", ops::min(ctx, a), Tolerance::exact("an element of a"));
    s.output("max_abs", ops::max_abs(ctx, a), Tolerance::exact("an element of a"));
  }});
}

// Copies of views whose last dimension is contiguous (by rows of 16-byte packs on CUDA when
// every stride allows, one element at a time otherwise): a head slice of a fused
// projection, a permutation of the outer dimensions, and a slice into a slice; rows of whole
// packs and rows no pack divides.
void strided_copy_case(DType dt, int64_t d) {
  register_twin({"basic", str_cat("strided copies of rows of ", d, " ", dtype_name(dt)), [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const int64_t b = 2, t = 96, heads = 12;
    const Tensor fused = s.random_native(Shape{b, t, heads, d}, dt, 3, -2, 2);  // (B, T, heads, D)
    const Tensor slice = fused.slice(2, 4, 10);                                  // (B, T, 6, D)
    s.output("contiguous(head slice)", ops::contiguous(ctx, slice), Tolerance::exact("a copy"));
    s.output("contiguous(outer permutation)", ops::contiguous(ctx, fused.permute({1, 0, 2, 3})),
             Tolerance::exact("a copy"));
    const Tensor into = s.empty(Shape{b, t, 16, d}, dt);
    ops::fill(ctx, into, 0.0);
    ops::copy(ctx, into.slice(2, 3, 9), slice);  // strided on both sides
    s.output("head slice into a head slice", into, Tolerance::exact("a copy"));
  }});
}

// The transposed bytes of a matrix (fp8_param's weights for the input gradient): a tiled
// transpose on CUDA, of sizes that leave partial tiles.
void byte_transpose_case() {
  register_twin({"basic", "contiguous transpose of a (300, 1000) byte matrix", [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const Tensor bytes = s.random_native(Shape{300, 500}, DType::bf16, 4, -2, 2).as_bytes();
    const Tensor m = bytes.view(Shape{300, 1000});  // (300, 1000) u8
    s.output("contiguous(m^T)", ops::contiguous(ctx, m.transpose(0, 1)), Tolerance::exact("a copy"));
  }});
}

// f32 a plus bf16 b of odd and even lengths, at offset 0 (aligned: the packed path where
// the length allows) and at offset 1 (misaligned: the scalar path).
void mixed_add_case(int64_t len, int64_t offset) {
  register_twin({"basic", str_cat("add f32 + bf16 ", len, " at offset ", offset), [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const int64_t n = 1 << 20;
    const Tensor a = s.random_native(Shape{n}, DType::f32, 1, -2, 2).narrow(0, offset, len);
    const Tensor b = s.random_native(Shape{n}, DType::bf16, 2, -2, 2).narrow(0, 0, len);
    const Tensor out = ops::empty(ctx, Shape{len}, DType::f32);
    ops::add(ctx, out, a, b);
    s.output("out", out, Tolerance::exact("b widened to f32, one f32 add on both sides"));
  }});
}

// The branch added to an f32 residual stream: f32 + bf16 -> f32 at a model's shapes.
void stream_add_case(int64_t rows, int64_t C) {
  register_twin({"basic", str_cat("add f32 stream + bf16 branch ", rows, "x", C), [=](TwinSide& s) {
    const Tensor x = s.random(Shape{rows, C}, DType::f32, 21, -3, 5);  // (N, C)
    const Tensor branch = s.random(Shape{rows, C}, DType::bf16, 26);
    const Tensor sum = s.empty(Shape{rows, C}, DType::f32);
    ops::add(s.ctx(), sum, x, branch);
    s.output("sum", sum, Tolerance::exact("no rounding beyond f32's, on both sides"));
  }});
}

void register_basic_twins() {
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64})
    elementwise_and_reductions_case(dt);
  for (int64_t len : {int64_t(1001), int64_t(4096)}) {
    for (int64_t offset : {int64_t(0), int64_t(1)}) mixed_add_case(len, offset);
  }
  strided_copy_case(DType::bf16, 64);
  strided_copy_case(DType::f32, 64);
  strided_copy_case(DType::f64, 2);
  strided_copy_case(DType::bf16, 6);
  byte_transpose_case();
  // GPT-2 width (8-wide packs: two 128-bit f32 loads per bf16 pack) and an odd width.
  stream_add_case(4096, 768);
  stream_add_case(300, 100);

  // axpby: bf16 gradients accumulated into f32.
  register_twin({"basic", "axpby f32 += bf16 1048576", [](TwinSide& s) {
    const int64_t n = 1 << 20;
    const Tensor y = s.random_native(Shape{n}, DType::f32, 1, -2, 2);
    const Tensor x = s.random_native(Shape{n}, DType::bf16, 2, -2, 2);
    ops::axpby(s.ctx(), y, 0.5, x, 0.9);
    s.output("y", y, Tolerance::elementwise(1e-6, "one multiply-add on both sides, in f32"));
  }});

  // Zeros over data (the memset path on CUDA), and -0, which keeps its sign bit.
  register_twin({"basic", "fill zeros over data, f32 and bf16", [](TwinSide& s) {
    Context& ctx = s.ctx();
    for (DType dt : {DType::f32, DType::bf16}) {
      const Tensor z = s.random_native(Shape{1000, 37}, dt, 5, -2, 2);
      ops::fill(ctx, z, 0.0);
      s.output(str_cat("zeros ", dtype_name(dt)), z, Tolerance::exact("zero bits"));
      ops::fill(ctx, z, -0.0);
      s.expect(std::signbit(ops::item(ctx, ops::min(ctx, z))), "-0 fills keep the sign bit");
    }
  }});

  // Fills through strided views, and a NaN reported by max, never hidden.
  register_twin({"basic", "fill strided views 4x4 bf16", [](TwinSide& s) {
    Context& ctx = s.ctx();
    const Tensor z = ops::zeros(ctx, Shape{4, 4}, DType::bf16);
    ops::fill(ctx, z.slice(1, 1, 3), 2.5);
    s.output("z", z, Tolerance::exact("2.5 is a bf16 value"));
    s.expect(ops::item(ctx, ops::sum(ctx, z)) == 20.0, "the filled columns sum to 20");
    ops::fill(ctx, z.slice(0, 3, 4).slice(1, 0, 1), NAN);
    s.expect(std::isnan(ops::item(ctx, ops::max(ctx, z))), "max reports the NaN");
  }});
}

}  // namespace
FSDP_REGISTER_TWINS(register_basic_twins)
}  // namespace fsdp::testing
