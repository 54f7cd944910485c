// Mixture-of-experts kernels (kernels/cuda/moe.h, and the grouped matmul on cuBLASLt) against
// the CPU at Mixtral-like (E = 8, k = 2) and fine-grained (E = 64, k = 8) routing of 4096
// tokens of C = 768 (expert hidden sizes 1024 and 256): the router in each model's variant
// (softmax, unnormalized softmax, sigmoid with a balancing bias), the grouping by expert, the
// gathers to and from the experts, the grouped matmul with experts that get no rows, and one
// whole layer chained.
#include <vector>

#include "kernels/ops.h"
#include "tests/kernels/nn_test_util.h"
#include "tests/kernels/twin_harness.h"

namespace fsdp::testing {
namespace {

const int64_t kTokens = 4096, kChannels = 768;
// Expert hidden sizes: Mixtral-like experts are wide; fine-grained ones (E = 64) narrow, as
// in OLMoE and Qwen3-MoE, which also keeps the CPU side's 64 weight matrices small.
int64_t hidden_for(int64_t experts) { return experts <= 8 ? 1024 : 256; }

// Routing and sorting are decided by comparisons of values both sides compute in double:
// the same experts, the same rows.
const Tolerance kSame = Tolerance::exact("integers from comparisons of the same values");
// Scores and weights: double on both sides, rounded once to f32.
const Tolerance kStats = Tolerance::elementwise(1e-6, "computed in double, rounded to f32");

// A result rounded once to dt after f32 (CUDA) or double (CPU) sums of a few terms.
Tolerance rounded_once(DType dt) {
  return dt == DType::bf16 ? Tolerance::scaled(5e-3, "one bf16 rounding")
                           : Tolerance::scaled(1e-5, "f32 sums of a few terms in f32");
}
// Matmul outputs (as matmul_twins.cc): one bf16 rounding, or f32 accumulation order.
Tolerance product_tolerance(DType out) {
  return out == DType::bf16
             ? Tolerance::scaled(5e-3, "one bf16 rounding of the output")
             : Tolerance::scaled(2e-5, "f32 accumulation in another order, sqrt(K) * 2^-24");
}

std::string variant_name(const ops::RouterOptions& o, bool bias) {
  return str_cat(o.score == ops::RouterScore::Softmax ? "softmax" : "sigmoid",
                 o.normalize ? "" : " unnormalized", bias ? " biased" : "");
}

// Top-k choices (N, k) made on the host: distinct experts per token, skewed towards the low
// experts, and never experts 1 or E - 1 (experts that get no rows). k <= E - 2.
std::vector<int32_t> skewed_choices(int64_t N, int64_t E, int64_t k, uint32_t seed) {
  std::vector<int32_t> live;
  for (int32_t e = 0; e < E; ++e)
    if (e != 1 && e != E - 1) live.push_back(e);
  const std::vector<double> u = uniform_values(N * k, seed, 0, 1);
  std::vector<int32_t> ids(size_t(N * k));
  for (int64_t n = 0; n < N; ++n) {
    std::vector<bool> taken(live.size(), false);
    for (int64_t j = 0; j < k; ++j) {
      const double v = u[size_t(n * k + j)];
      size_t at = size_t(v * v * double(live.size()));  // skewed: low experts more often
      while (taken[at]) at = (at + 1) % live.size();
      taken[at] = true;
      ids[size_t(n * k + j)] = live[at];
    }
  }
  return ids;
}

std::vector<int64_t> count_choices(const std::vector<int32_t>& ids, int64_t E) {
  std::vector<int64_t> counts(size_t(E), 0);
  for (int32_t e : ids) ++counts[size_t(e)];
  return counts;
}

void router_case(int64_t E, int64_t k, ops::RouterOptions o, bool bias, DType dt) {
  o.top_k = k;
  const std::string name = str_cat("router ", kTokens, "x", E, " k", k, " ",
                                   variant_name(o, bias), " ", dtype_name(dt));
  register_twin({"moe", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const int64_t N = kTokens;
    // bf16 logits tie often (8-bit mantissas): the ties must break the same way.
    const Tensor logits = s.random(Shape{N, E}, dt, 31, -2, 2);  // (N, E)
    const Tensor expert_bias =
        bias ? s.random(Shape{E}, DType::f32, 32, -0.05, 0.05) : Tensor();  // (E)
    const Tensor indices = s.empty(Shape{N, k}, DType::i32);
    const Tensor weights = s.empty(Shape{N, k}, DType::f32);
    const Tensor scores = s.empty(Shape{N, E}, DType::f32);
    ops::moe_router_forward(ctx, indices, weights, scores, logits, o, expert_bias);
    s.output("indices", indices, kSame);
    s.output("scores", scores, kStats);
    s.output("weights", weights, kStats);
    if (bias) {
      const Tensor plain = s.empty(Shape{N, k}, DType::i32);
      ops::moe_router_forward(ctx, plain, s.empty(Shape{N, k}, DType::f32),
                              s.empty(Shape{N, E}, DType::f32), logits, o);
      s.expect(s.values(plain) != s.values(indices), "the bias changes some choices");
    }
    // The weights' gradient and a direct one into the scores (a load-balancing loss's).
    const Tensor dweights = s.random(Shape{N, k}, DType::f32, 33);
    const Tensor dscores = s.random(Shape{N, E}, DType::f32, 34, -0.01, 0.01);
    const Tensor dlogits = s.empty(Shape{N, E}, dt);
    ops::moe_router_backward(ctx, dlogits, dweights, scores, indices, o, dscores);
    s.output("dlogits", dlogits,
             dt == DType::bf16 ? Tolerance::scaled(5e-3, "one bf16 rounding")
                               : Tolerance::scaled(1e-5, "double from the same f32 inputs"));
  }});
}

void sort_case(int64_t E, int64_t k) {
  const std::string name = str_cat("sort_by_expert ", kTokens, "x", k, " E", E, " skewed");
  register_twin({"moe", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const int64_t N = kTokens;
    const std::vector<int32_t> ids = skewed_choices(N, E, k, 41);
    const Tensor indices = s.indices(ids, Shape{N, k});
    const Tensor counts = s.empty(Shape{E}, DType::i32);
    const Tensor source = s.empty(Shape{N * k}, DType::i32);
    const Tensor dest = s.empty(Shape{N, k}, DType::i32);
    ops::moe_sort_by_expert(ctx, counts, source, dest, indices);
    s.output("counts", counts, kSame);
    s.output("source", source, kSame);
    s.output("dest", dest, kSame);
    std::vector<double> want;
    for (int64_t c : count_choices(ids, E)) want.push_back(double(c));
    s.expect(s.values(counts) == want, "the counts are the host's");
  }});
}

// The gathers to and from the experts, forward and backward, on rows grouped as the host's
// choices give them.
void gather_case(int64_t E, int64_t k, DType dt) {
  const std::string name = str_cat("permute/unpermute ", kTokens, "x", kChannels, " k", k, " E",
                                   E, " ", dtype_name(dt));
  register_twin({"moe", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const int64_t N = kTokens, C = kChannels, R = N * k;
    const Tensor indices = s.indices(skewed_choices(N, E, k, 51), Shape{N, k});
    const Tensor counts = s.empty(Shape{E}, DType::i32), source = s.empty(Shape{R}, DType::i32);
    const Tensor dest = s.empty(Shape{N, k}, DType::i32);
    ops::moe_sort_by_expert(ctx, counts, source, dest, indices);

    const Tensor x = s.random(Shape{N, C}, dt, 52);
    const Tensor x_sorted = s.empty(Shape{R, C}, dt);
    ops::moe_permute(ctx, x_sorted, x, source);
    s.output("x_sorted", x_sorted, Tolerance::exact("a gather copies"));
    const Tensor dx_sorted = s.random(Shape{R, C}, dt, 53);
    const Tensor dx = s.full(Shape{N, C}, dt, 0.5);
    ops::moe_permute_backward(ctx, dx, dx_sorted, dest, true);
    s.output("dx (accumulated)", dx, rounded_once(dt));

    const Tensor y_sorted = s.random(Shape{R, C}, dt, 54);
    const Tensor weights = s.random(Shape{N, k}, DType::f32, 55, 0, 1);
    const Tensor out = s.empty(Shape{N, C}, dt);
    ops::moe_unpermute(ctx, out, y_sorted, weights, dest);
    s.output("out", out, rounded_once(dt));
    const Tensor dout = s.random(Shape{N, C}, dt, 56);
    const Tensor dy_sorted = s.empty(Shape{R, C}, dt);
    const Tensor dweights = s.empty(Shape{N, k}, DType::f32);
    ops::moe_unpermute_backward(ctx, dy_sorted, dweights, dout, y_sorted, weights, dest);
    s.output("dy_sorted", dy_sorted, rounded_once(dt));
    s.output("dweights", dweights, Tolerance::scaled(1e-5, "f32 dot products of 768 terms"));
    const Tensor again = s.empty(Shape{N, k}, DType::f32);
    ops::moe_unpermute_backward(ctx, dy_sorted, again, dout, y_sorted, weights, dest);
    s.expect(s.values(again) == s.values(dweights), "dweights has the same bits when run again");
  }});
}

// Experts' first linear layers: x_sorted (R, C) @ w_e^T for w (E, F, C), with experts 1 and
// E - 1 given no rows.
// Auto: the experts with few rows in one cuBLAS grouped GEMM per product on CUDA, the
// others (and under PerExpert all) one cuBLASLt matmul each.
void grouped_matmul_case(int64_t N, int64_t E, int64_t k, DType dt, ops::GroupedMatmulMethod m) {
  const int64_t F = hidden_for(E);
  const bool per_expert = m == ops::GroupedMatmulMethod::PerExpert;
  const std::string name = str_cat("grouped_matmul ", N * k, "x", F, "x", kChannels, " E", E, " ",
                                   dtype_name(dt), per_expert ? " per expert" : " auto");
  register_twin({"moe", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const int64_t R = N * k, C = kChannels;
    const std::vector<int64_t> counts = count_choices(skewed_choices(N, E, k, 61), E);
    const Tensor x = s.random(Shape{R, C}, dt, 62);
    const Tensor w = s.random(Shape{E, F, C}, dt, 63, -0.05, 0.05);
    const Tensor y = s.empty(Shape{R, F}, dt);
    ops::moe_grouped_matmul(ctx, y, x, w, counts, m);
    s.output("y", y, product_tolerance(dt));

    const Tensor dy = s.random(Shape{R, F}, dt, 64);
    const Tensor dx = s.empty(Shape{R, C}, dt);
    const Tensor dw = s.full(Shape{E, F, C}, DType::f32, 0.25);  // f32 gradients accumulate
    ops::moe_grouped_matmul_backward(ctx, dx, dw, dy, x, w, counts, true, m);
    s.output("dx", dx, product_tolerance(dt));
    s.output("dw (accumulated in f32)", dw, product_tolerance(DType::f32));
    s.expect(s.values(dw.select(0, 1)) == std::vector<double>(size_t(F * C), 0.25),
             "an expert without rows keeps its gradient");
    // Gradients in the compute dtype, overwritten: zero for the experts without rows.
    const Tensor dw_own = s.full(Shape{E, F, C}, dt, 3.0);
    ops::moe_grouped_matmul_backward(ctx, Tensor(), dw_own, dy, x, w, counts, false, m);
    s.output("dw (overwritten)", dw_own, product_tolerance(dt));
    s.expect(s.values(dw_own.select(0, E - 1)) == std::vector<double>(size_t(F * C), 0.0),
             "an expert without rows gets 0");
  }});
}

// A whole layer in f32 (DeepSeek-V3's routing: sigmoid, bias, normalized): router ->
// sort -> permute -> experts -> combine, and every gradient back to x, w and the logits. The
// counts are read back to the host between the sort and the experts, as the layer will.
void layer_case() {
  const int64_t N = 1024, E = 64, k = 8, F = hidden_for(E);
  const std::string name = str_cat("layer ", N, "x", kChannels, " E", E, " k", k, " F", F,
                                   " sigmoid biased f32");
  register_twin({"moe", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const int64_t C = kChannels, R = N * k;
    const DType dt = DType::f32;
    const ops::RouterOptions o{ops::RouterScore::Sigmoid, k, true};
    const Tensor x = s.random(Shape{N, C}, dt, 71);
    const Tensor logits = s.random(Shape{N, E}, dt, 72, -3, 3);
    const Tensor bias = s.random(Shape{E}, DType::f32, 73, -0.2, 0.2);
    const Tensor w = s.random(Shape{E, F, C}, dt, 74, -0.05, 0.05);
    const Tensor indices = s.empty(Shape{N, k}, DType::i32);
    const Tensor weights = s.empty(Shape{N, k}, DType::f32);
    const Tensor scores = s.empty(Shape{N, E}, DType::f32);
    ops::moe_router_forward(ctx, indices, weights, scores, logits, o, bias);
    const Tensor counts = s.empty(Shape{E}, DType::i32), source = s.empty(Shape{R}, DType::i32);
    const Tensor dest = s.empty(Shape{N, k}, DType::i32);
    ops::moe_sort_by_expert(ctx, counts, source, dest, indices);
    std::vector<int64_t> host_counts;
    for (int32_t c : ops::to_vector<int32_t>(ctx, ops::to_host(ctx, counts)))
      host_counts.push_back(c);

    const Tensor xs = s.empty(Shape{R, C}, dt), ys = s.empty(Shape{R, F}, dt);
    ops::moe_permute(ctx, xs, x, source);
    ops::moe_grouped_matmul(ctx, ys, xs, w, host_counts);
    const Tensor out = s.empty(Shape{N, F}, dt);
    ops::moe_unpermute(ctx, out, ys, weights, dest);
    s.output("out", out, product_tolerance(dt));

    const Tensor dout = s.random(Shape{N, F}, dt, 75);
    const Tensor dys = s.empty(Shape{R, F}, dt), dweights = s.empty(Shape{N, k}, DType::f32);
    ops::moe_unpermute_backward(ctx, dys, dweights, dout, ys, weights, dest);
    const Tensor dxs = s.empty(Shape{R, C}, dt), dw = s.empty(Shape{E, F, C}, DType::f32);
    ops::moe_grouped_matmul_backward(ctx, dxs, dw, dys, xs, w, host_counts, false);
    const Tensor dx = s.empty(Shape{N, C}, dt), dlogits = s.empty(Shape{N, E}, dt);
    ops::moe_permute_backward(ctx, dx, dxs, dest, false);
    ops::moe_router_backward(ctx, dlogits, dweights, scores, indices, o);
    s.output("dweights", dweights, Tolerance::scaled(2e-5, "f32 products and dot products"));
    s.output("dx", dx, product_tolerance(dt));
    s.output("dw", dw, product_tolerance(dt));
    s.output("dlogits", dlogits, Tolerance::scaled(2e-5, "from dweights, f32 products"));
  }});
}

// The balancing loss (over the whole batch, and per sequence of 512 tokens) and the z-loss,
// from scores the router made on both sides and skewed choices.
void losses_case(int64_t E, int64_t k, bool sigmoid, int64_t groups, DType dt) {
  const std::string name = str_cat("losses ", kTokens, "x", E, " k", k, sigmoid ? " sigmoid" : "",
                                   " groups", groups, " ", dtype_name(dt));
  register_twin({"moe", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const int64_t N = kTokens;
    const Tensor logits = s.random(Shape{N, E}, dt, 51, -3, 3);  // (N, E)
    ops::RouterOptions o{sigmoid ? ops::RouterScore::Sigmoid : ops::RouterScore::Softmax, k, true};
    const Tensor scores = s.empty(Shape{N, E}, DType::f32);  // (N, E) the router's, on each side
    ops::moe_router_forward(ctx, s.empty(Shape{N, k}, DType::i32), s.empty(Shape{N, k}, DType::f32),
                            scores, logits, o);
    const Tensor indices = s.indices(skewed_choices(N, E, k, 52), Shape{N, k});
    const Tensor per_token = s.empty(Shape{N}, DType::f32);
    const Tensor dscores = s.empty(Shape{N, E}, DType::f32);
    ops::moe_balancing_loss(ctx, per_token, dscores, scores, indices, groups, sigmoid, 0.01);
    // Sums of E terms in double (a warp's order on CUDA), rounded once to f32.
    s.output("balancing per token", per_token, kStats);
    s.output("dscores", dscores, kStats);
    s.output("balancing loss", ops::sum(ctx, per_token),
             Tolerance::scaled(1e-5, "f32 sums of 4096 terms in another order"));
    // The first half of each run, as a context-parallel rank holds it, with the whole runs'
    // choices: its tokens' terms of the whole loss, the whole run's terms of those tokens.
    const int64_t n = N / groups, half = n / 2;
    const Tensor counts = s.empty(Shape{groups, E}, DType::i32);
    ops::moe_group_expert_counts(ctx, counts, indices, groups);
    s.output("run counts", counts, Tolerance::exact("integer counts"));
    auto first_halves = [&](const Tensor& t) {  // (N, W) -> (groups * half, W)
      const int64_t w = t.size(1);
      return ops::contiguous(ctx, t.view(Shape{groups, n, w}).narrow(1, 0, half)).view(Shape{groups * half, w});
    };
    const Tensor part_per_token = s.empty(Shape{groups * half}, DType::f32);
    const Tensor part_dscores = s.empty(Shape{groups * half, E}, DType::f32);
    ops::moe_balancing_loss(ctx, part_per_token, part_dscores, first_halves(scores),
                            first_halves(indices), groups, sigmoid, 0.01, counts, n);
    s.output("part dscores", part_dscores, kStats);
    const Tensor whole_per_token = first_halves(per_token.view(Shape{N, 1})).flatten();
    s.expect(s.values(part_per_token) == s.values(whole_per_token) &&
                 s.values(part_dscores) == s.values(first_halves(dscores)),
             "a run's part with the whole run's counts gives the whole run's terms bit for bit");
    const Tensor z_per_token = s.empty(Shape{N}, DType::f32);
    const Tensor dlogits = s.empty(Shape{N, E}, dt);
    ops::moe_z_loss(ctx, z_per_token, dlogits, logits, 0.001);
    s.output("z per token", z_per_token, kStats);
    s.output("z dlogits", dlogits, dt == DType::bf16 ? Tolerance::scaled(5e-3, "one bf16 rounding")
                                                     : kStats);
  }});
}

void register_moe_twins() {
  const ops::RouterOptions softmax{ops::RouterScore::Softmax, 0, true};
  const ops::RouterOptions olmoe{ops::RouterScore::Softmax, 0, false};
  const ops::RouterOptions sigmoid{ops::RouterScore::Sigmoid, 0, true};
  for (DType dt : {DType::bf16, DType::f32}) {
    router_case(8, 2, softmax, false, dt);
    router_case(64, 8, softmax, false, dt);
    router_case(64, 8, olmoe, false, dt);
    router_case(64, 8, sigmoid, true, dt);
  }
  router_case(64, 64, softmax, false, DType::f32);  // k = E: every expert, in order
  sort_case(8, 2);
  sort_case(64, 8);
  for (DType dt : {DType::bf16, DType::f32}) {
    gather_case(8, 2, dt);
    gather_case(64, 8, dt);
    for (auto m : {ops::GroupedMatmulMethod::Auto, ops::GroupedMatmulMethod::PerExpert}) {
      grouped_matmul_case(kTokens, 8, 2, dt, m);
      grouped_matmul_case(1024, 64, 8, dt, m);
    }
  }
  layer_case();
  losses_case(8, 2, false, 1, DType::bf16);
  losses_case(64, 8, false, 8, DType::f32);
  losses_case(64, 8, true, 1, DType::bf16);
}

}  // namespace
FSDP_REGISTER_TWINS(register_moe_twins)
}  // namespace fsdp::testing
