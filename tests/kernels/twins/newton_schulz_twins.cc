// Muon's Newton-Schulz orthogonalization (kernels/cuda/newton_schulz.h): CUDA's bf16 products
// against the CPU's f32 iteration on the same bf16-rounded matrices, wide, tall and batched.
#include "kernels/ops.h"
#include "runtime/core/error.h"
#include "tests/kernels/twin_harness.h"

namespace fsdp::testing {
namespace {

// CUDA rounds every product to bf16 (2^-9 relative) and the CPU keeps f32: each of the five
// iterations multiplies by a matrix polynomial of slope up to a = 3.4 at small singular
// values, so a rounding of an early iterate grows by a few times before the later ones
// contract it. The outputs' entries are ~1/sqrt(cols) with singular values in [0.7, 1.2].
constexpr double kScaled = 3e-2;
const char* const kWhy = "bf16 products through 5 iterations against f32 on the CPU";

void orthogonalize_case(const Shape& shape, DType out_dtype, uint32_t seed) {
  const std::string name = str_cat("newton_schulz ", shape_name(shape), " out ", dtype_name(out_dtype));
  register_twin({"newton_schulz", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const Tensor x = s.random(shape, DType::bf16, seed);
    const Tensor out = s.empty(shape, out_dtype);
    ops::newton_schulz(ctx, x, out, ops::NewtonSchulzScalars{});
    s.output("out", out, Tolerance::scaled(kScaled, kWhy));
  }});
}

void register_newton_schulz_twins() {
  orthogonalize_case(Shape{256, 768}, DType::f32, 1);     // wide: an attention projection's part
  orthogonalize_case(Shape{768, 192}, DType::f32, 2);     // tall: iterated on its transpose
  orthogonalize_case(Shape{3, 64, 256}, DType::f32, 3);   // a batch of same-shape matrices
  orthogonalize_case(Shape{2, 384, 96}, DType::bf16, 4);  // tall, batched, bf16 out
}

}  // namespace
FSDP_REGISTER_TWINS(register_newton_schulz_twins)
}  // namespace fsdp::testing
