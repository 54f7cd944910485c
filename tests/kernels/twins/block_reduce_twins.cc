// Per-block sums of squares with a fixed order (kernels/cuda/block_reduce.h, the sharded
// gradient norm) against the CPU, in every floating dtype, with blocks that fit the thread
// block exactly and blocks that do not.
#include "kernels/ops.h"
#include "runtime/core/error.h"
#include "tests/kernels/twin_harness.h"

namespace fsdp::testing {
namespace {

// The CPU sums each block in f64 in index order (then stores f32); CUDA sums strided subsets
// in f32 and combines them in a tree: positive terms, so the relative error stays near
// sqrt(block) * 2^-24. f64 input is summed in f64 on both sides.
Tolerance partial_tolerance(DType dt) {
  return dt == DType::f64 ? Tolerance::scaled(1e-12, "f64 sums in another order")
                          : Tolerance::scaled(1e-5, "f32 sums of positive terms in another order");
}

void block_sum_squares_case(int64_t nblocks, int64_t block, DType dt) {
  const std::string name = str_cat("block_sum_squares ", nblocks, " blocks of ", block, " ",
                                   dtype_name(dt));
  register_twin({"block_reduce", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    // Two equal halves (2, nblocks / 2 * block): equal blocks must give equal partials, as on
    // two ranks holding the same shard.
    const Tensor halves = s.random_native(Shape{2, nblocks / 2 * block}, dt, 61);
    ops::copy(ctx, halves.select(0, 1), halves.select(0, 0));
    const Tensor partials = ops::block_sum_squares(ctx, halves.view(Shape{nblocks * block}), block);
    s.output("partials", partials, partial_tolerance(dt));
    const std::vector<double> p = s.values(partials);
    bool equal_halves = true;
    for (size_t i = 0; i < size_t(nblocks / 2); ++i) equal_halves &= p[i] == p[i + p.size() / 2];
    s.expect(equal_halves, "equal blocks give bitwise equal partials");
  }});
}

void register_block_reduce_twins() {
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    block_sum_squares_case(8, 65536, dt);  // large blocks, a power of two
    block_sum_squares_case(74, 1000, dt);  // blocks off every thread-block size
  }
}

}  // namespace
FSDP_REGISTER_TWINS(register_block_reduce_twins)
}  // namespace fsdp::testing
