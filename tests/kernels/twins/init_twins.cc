// The counter-based initializers (kernels/cuda/init.h) against the CPU: the same generator
// and double math on both sides, slice invariance and the normal's moments, in f32 and bf16.
#include <cmath>

#include "kernels/ops.h"
#include "runtime/core/error.h"
#include "tests/kernels/twin_harness.h"

namespace fsdp::testing {
namespace {

// Same generator and double math on both devices: equal up to the last bit of libm.
const Tolerance kSameGenerator =
    Tolerance::scaled(1e-6, "same generator and double math; libm's last bit");

void init_case(DType dt) {
  const int64_t n = 3072 * 768;  // GPT-2 124M's c_fc weight
  const std::string name = str_cat("init_normal and init_uniform ", n, " ", dtype_name(dt));
  register_twin({"init", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const uint64_t seed = 42, key = ops::name_key("transformer.h.3.mlp.c_fc.weight");
    // The initializers write every floating dtype on both sides.
    const Tensor full = ops::empty(ctx, Shape{n}, dt);
    ops::init_normal(ctx, full, seed, key, 0, 0.0, 0.02);
    s.output("normal", full, kSameGenerator);
    // Any slice initialized alone equals that slice of the whole.
    for (int64_t offset : {int64_t(0), int64_t(1), int64_t(n / 2 + 1)}) {
      const Tensor part = ops::empty(ctx, Shape{4097}, dt);
      ops::init_normal(ctx, part, seed, key, offset, 0.0, 0.02);
      s.expect(s.values(part) == s.values(full.narrow(0, offset, 4097)),
               str_cat("the slice at ", offset, " initialized alone is the same"));
    }
    // The moments of 2.4M draws: the mean within 5 standard errors of 0, the standard
    // deviation within 0.5% of 0.02.
    const std::vector<double> v = s.values(full);
    double mean = 0, var = 0;
    for (double x : v) mean += x / double(n);
    for (double x : v) var += (x - mean) * (x - mean) / double(n);
    s.expect(std::fabs(mean) < 5 * 0.02 / std::sqrt(double(n)), "the normal's mean is 0");
    s.expect(std::fabs(std::sqrt(var) - 0.02) < 0.02 * 5e-3, "the normal's std is 0.02");

    const Tensor uniform = ops::empty(ctx, Shape{n}, dt);
    ops::init_uniform(ctx, uniform, seed, key, 0, -0.5, 0.5);
    s.output("uniform", uniform, kSameGenerator);
  }});
}

void register_init_twins() {
  for (DType dt : {DType::f32, DType::bf16}) init_case(dt);
}

}  // namespace
FSDP_REGISTER_TWINS(register_init_twins)
}  // namespace fsdp::testing
