// Deterministic column sums (kernels/cuda/column_sum.h) through bias_backward, against the
// CPU: into f32 (accumulated) and into bf16, on the packed and the scalar column paths.
// (The norms' weight gradients and the position-embedding gradient use the same sums; their
// cases are in norm_twins.cc and embedding_twins.cc.)
#include "kernels/ops.h"
#include "runtime/core/error.h"
#include "tests/kernels/twin_harness.h"

namespace fsdp::testing {
namespace {

void bias_backward_case(int64_t n, DType dt) {
  const std::string name = str_cat("bias_backward 4096x", n, " ", dtype_name(dt));
  register_twin({"column_sum", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const Tensor dout = s.random(Shape{4096, n}, dt, 13);  // (N, n)
    const Tensor db = s.full(Shape{n}, DType::f32, 1.0);
    ops::bias_backward(ctx, db, dout, true);
    // Sums of 4096 terms of |x| <= 1 (scale ~64) in f32, in another order.
    s.output("dbias f32 accumulated", db,
             Tolerance::scaled(1e-5, "f32 sums of 4096 terms in another order"));
    // Deterministic: the same sums again give the same bits.
    const Tensor again = s.full(Shape{n}, DType::f32, 1.0);
    ops::bias_backward(ctx, again, dout, true);
    s.expect(s.values(again) == s.values(db), "the same bits when run again");
    const Tensor db_bf16 = s.empty(Shape{n}, DType::bf16);
    ops::bias_backward(ctx, db_bf16, dout, false);
    s.output("dbias bf16", db_bf16, Tolerance::scaled(5e-3, "one bf16 rounding of the sum"));
  }});
}

void register_column_sum_twins() {
  for (DType dt : {DType::bf16, DType::f32}) {
    bias_backward_case(2304, dt);  // packed column loads
    bias_backward_case(37, dt);    // the scalar column path
  }
}

}  // namespace
FSDP_REGISTER_TWINS(register_column_sum_twins)
}  // namespace fsdp::testing
