// The fused cross-entropy (kernels/cuda/cross_entropy.h) against the CPU over GPT-2's padded
// vocabulary (and an odd width, the scalar path): forward, backward in place, and both in one
// pass, with ignored rows and padding columns that must not count.
#include <tuple>
#include <vector>

#include "kernels/ops.h"
#include "runtime/core/error.h"
#include "tests/kernels/nn_test_util.h"
#include "tests/kernels/twin_harness.h"

namespace fsdp::testing {
namespace {

// Losses and log-sum-exp: f32 sums of up to 50257 exponentials (fast exp on CUDA).
const Tolerance kLoss = Tolerance::scaled(1e-5, "f32 sums of exponentials, fast exp on CUDA");
// The gradient (softmax - onehot) * dloss in the logits' dtype.
Tolerance gradient_tolerance(DType dt) {
  return dt == DType::bf16 ? Tolerance::scaled(5e-3, "one bf16 rounding of the gradient")
                           : Tolerance::scaled(1e-5, "f32 exp and division");
}

// Targets in [0, V) with every `ignored_every`-th row (from `first_ignored`) ignored (-1),
// and row `last_class_row` on the last real class.
std::vector<int32_t> make_targets(int64_t N, int64_t V, uint32_t seed, int ignored_every,
                                  int first_ignored, size_t last_class_row) {
  std::vector<int32_t> t(size_t(N), 0);
  const std::vector<double> u = uniform_values(N, seed, 0, 1);
  for (size_t i = 0; i < t.size(); ++i)
    t[i] = int(i % ignored_every) == first_ignored ? -1 : int32_t(u[i] * (V - 1));
  t[last_class_row] = int32_t(V - 1);
  return t;
}

// Logits (N, Vp) in [-8, 8) with the padding columns [V, Vp) at 100: they must not count.
Tensor padded_logits(TwinSide& s, int64_t N, int64_t V, int64_t Vp, DType dt, uint32_t seed) {
  const Tensor logits = s.random(Shape{N, Vp}, dt, seed, -8, 8);
  ops::fill(s.ctx(), logits.slice(1, V, Vp), 100.0);
  return logits;
}

// The gradient is zero in the padding columns and in ignored row `ignored_row`.
void expect_zero_padding_and_ignored(TwinSide& s, const Tensor& dlogits, int64_t V, int64_t Vp,
                                     int64_t ignored_row) {
  s.expect(max_abs(s.values(dlogits.slice(1, V, Vp))) == 0.0, "zero gradient in the padding");
  s.expect(max_abs(s.values(dlogits.select(0, ignored_row))) == 0.0,
           "zero gradient in an ignored row");
}

void separate_kernels_case(DType dt) {
  const int64_t N = 1024, V = 50257, Vp = 50304;
  const std::string name = str_cat("cross_entropy ", N, "x", Vp, " V", V, " ", dtype_name(dt));
  register_twin({"cross_entropy", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const Tensor targets = s.indices(make_targets(N, V, 13, 7, 3, 1), Shape{N});
    const Tensor logits = padded_logits(s, N, V, Vp, dt, 14);  // (N, Vp)
    const Tensor losses = s.empty(Shape{N}, DType::f32), lse = s.empty(Shape{N}, DType::f32);
    ops::cross_entropy_forward(ctx, losses, lse, logits, targets, V);
    s.output("lse", lse, kLoss);
    s.output("losses", losses, kLoss);
    s.expect(s.values(losses)[3] == 0.0, "an ignored row's loss is 0");
    // In place, the way the classifier runs it.
    ops::cross_entropy_backward(ctx, logits, logits, lse, targets, V, 1.0 / double(N));
    s.output("dlogits", logits, gradient_tolerance(dt));
    expect_zero_padding_and_ignored(s, logits, V, Vp, 3);
  }});
}

// Forward and backward in one pass: against the CPU, and on CUDA against its own two-kernel
// path bit for bit (the fused kernel merges the block's partial sums in the same order).
void one_pass_case(int64_t N, int64_t V, int64_t Vp, DType dt) {
  const std::string name = str_cat("cross_entropy_forward_backward ", N, "x", Vp, " V", V, " ",
                                   dtype_name(dt));
  register_twin({"cross_entropy", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const double dloss = 1.0 / double(N);
    const Tensor targets = s.indices(make_targets(N, V, 16, 5, 2, 0), Shape{N});
    const Tensor logits = padded_logits(s, N, V, Vp, dt, 17);  // (N, Vp)
    // The two-kernel path on a copy.
    const Tensor two = ops::clone(ctx, logits);
    const Tensor two_losses = s.empty(Shape{N}, DType::f32);
    const Tensor two_lse = s.empty(Shape{N}, DType::f32);
    ops::cross_entropy_forward(ctx, two_losses, two_lse, two, targets, V);
    ops::cross_entropy_backward(ctx, two, two, two_lse, targets, V, dloss);
    // Losses only: the logits stay.
    const Tensor kept = ops::clone(ctx, logits);
    const Tensor losses = s.empty(Shape{N}, DType::f32);
    ops::cross_entropy_forward_backward(ctx, losses, kept, targets, V, dloss, false);
    s.expect(s.values(kept) == s.values(logits), "without write_grad the logits stay");
    s.output("losses only", losses, kLoss);
    const std::vector<double> losses_only = s.values(losses);

    ops::cross_entropy_forward_backward(ctx, losses, logits, targets, V, dloss, true);
    s.output("losses", losses, kLoss);
    s.output("dlogits", logits, gradient_tolerance(dt));
    s.expect(s.values(losses)[2] == 0.0, "an ignored row's loss is 0");
    expect_zero_padding_and_ignored(s, logits, V, Vp, 2);
    // CUDA's one pass gives its two kernels' bits. (The CPU reference is free to sum in
    // another order in each.)
    if (!s.is_reference()) {
      s.expect(losses_only == s.values(two_losses), "losses only: the two kernels' losses");
      s.expect(s.values(losses) == s.values(two_losses), "one pass: the two kernels' losses");
      s.expect(s.values(logits) == s.values(two), "one pass: the two kernels' gradient");
    }
  }});
}

// Vocabulary parallelism over `shards` ranks, on one device: each shard's statistics from
// its columns, merged (as every rank merges the all-gathered partials), against the whole
// row's loss; then each shard's columns of the gradient in place.
void shard_case(int64_t shards, DType dt) {
  const int64_t N = 777, V = 50257, Vp = 50304, S = Vp / shards;
  const std::string name = str_cat("cross_entropy shards ", shards, " x ", S, " of ", N, "x", Vp,
                                   " V", V, " ", dtype_name(dt));
  register_twin({"cross_entropy", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const double dloss = 1.0 / double(N);
    const Tensor targets = s.indices(make_targets(N, V, 23, 6, 1, 4), Shape{N});
    const Tensor logits = padded_logits(s, N, V, Vp, dt, 24);  // (N, Vp)
    const Tensor partials = s.empty(Shape{shards, 3, N}, DType::f32);
    std::vector<Tensor> parts;
    for (int64_t r = 0; r < shards; ++r) {
      parts.push_back(ops::contiguous(ctx, logits.slice(1, r * S, (r + 1) * S)));  // (N, S)
      ops::cross_entropy_shard_stats(ctx, partials.select(0, r), parts.back(), targets, V, r * S);
    }
    const Tensor losses = s.empty(Shape{N}, DType::f32), lse = s.empty(Shape{N}, DType::f32);
    ops::cross_entropy_merge_shards(ctx, losses, lse, partials, targets);
    s.output("merged lse", lse, kLoss);
    s.output("merged losses", losses, kLoss);
    s.expect(s.values(losses)[1] == 0.0, "an ignored row's loss is 0");
    // The whole row's loss on the same side: the merge changes only the order of the sums.
    const Tensor whole_losses = s.empty(Shape{N}, DType::f32), whole_lse = s.empty(Shape{N}, DType::f32);
    ops::cross_entropy_forward(ctx, whole_losses, whole_lse, logits, targets, V);
    s.expect(max_rel_diff(s.values(losses), s.values(whole_losses), 1.0) < 1e-5,
             "merged losses equal the whole row's within f32 sums in another order");
    for (int64_t r = 0; r < shards; ++r) {
      ops::cross_entropy_shard_backward(ctx, parts[size_t(r)], parts[size_t(r)], lse, targets, V,
                                        r * S, dloss);
      s.output(str_cat("dlogits of shard ", r), parts[size_t(r)], gradient_tolerance(dt));
    }
  }});
}

void register_cross_entropy_twins() {
  for (int64_t shards : {2, 4})
    for (DType dt : {DType::bf16, DType::f32}) shard_case(shards, dt);
  for (DType dt : {DType::bf16, DType::f32}) separate_kernels_case(dt);
  // GPT-2's padded vocabulary (packed loads), and an odd width (the scalar path).
  for (auto [N, V, Vp] :
       {std::tuple<int64_t, int64_t, int64_t>{777, 50257, 50304}, {300, 1000, 1001}}) {
    for (DType dt : {DType::bf16, DType::f32}) one_pass_case(N, V, Vp, dt);
  }
}

}  // namespace
FSDP_REGISTER_TWINS(register_cross_entropy_twins)
}  // namespace fsdp::testing
