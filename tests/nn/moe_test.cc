// The mixture-of-experts layer (runtime/nn/moe.h): its backward against central finite
// differences in f64 (input, router, experts, shared expert; every balancing loss and the
// z-loss, softmax and sigmoid scores, k = 1 and 2, an expert that gets no token, an expert
// bias, the shared expert beside the dispatch), the losses' values on hand-made routings, the expert-bias update, and one expert
// with k = 1 equal to the dense MLP; under expert parallelism, the shared expert between
// the dispatch's start and its end.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "runtime/nn/expert_parallel.h"
#include "runtime/nn/functional.h"
#include "runtime/nn/init.h"
#include "runtime/nn/moe.h"
#include "tests/nn/gradcheck.h"
#include "tests/test_support.h"

namespace fsdp::testing {
namespace {

using autograd::Graph;
using nn::MlpActivation;
using nn::MoeBalancing;
using nn::MoeOptions;

constexpr int64_t kB = 2, kT = 5, kC = 8, kE = 4, kF = 6, kShared = 5;

// Random f64 values for every parameter, then the router row of the last expert pointing
// against the inputs' common direction (channel 0, where every token holds about +3): its
// logit is far below the others, so it never gets a token.
void setup(Context& ctx, nn::MoELayer& layer, uint64_t seed) {
  nn::materialize(ctx, layer, DType::f64, seed);
  uint64_t i = 0;
  for (nn::Parameter* p : layer.named_parameters()) fill_random(ctx, p->data, seed + 10 * ++i, 0.5);
  double* w = layer.router.weight().data.data<double>();  // (E, C)
  for (int64_t e = 0; e < kE - 1; ++e) w[e * kC] = 0.0;
  w[(kE - 1) * kC] = -4.0;
}

Tensor inputs(Context& ctx, uint64_t seed) {
  Tensor x = ctx.empty(Shape{kB, kT, kC}, DType::f64);
  fill_random(ctx, x, seed, 1.0);
  double* v = x.data<double>();
  for (int64_t n = 0; n < kB * kT; ++n) v[n * kC] = 3.0 + 0.1 * v[n * kC];
  return x;
}

// The smallest gap, over tokens, between the k-th and (k+1)-th largest selection values
// (logits; logits + bias for a biased sigmoid: both orders are the scores' orders).
double routing_margin(const Tensor& x, const Tensor& w, int64_t k, const std::vector<float>& bias,
                      bool sigmoid) {
  const double* xv = x.data<double>();
  const double* wv = w.data<double>();
  double margin = 1e9;
  for (int64_t n = 0; n < kB * kT; ++n) {
    std::vector<double> s;
    for (int64_t e = 0; e < kE; ++e) {
      double l = 0;
      for (int64_t c = 0; c < kC; ++c) l += xv[n * kC + c] * wv[e * kC + c];
      if (sigmoid) l = 1 / (1 + std::exp(-l)) + (bias.empty() ? 0.0 : bias[size_t(e)]);
      s.push_back(l);
    }
    std::sort(s.rbegin(), s.rend());
    margin = std::min(margin, s[size_t(k - 1)] - s[size_t(k)]);
  }
  return margin;
}

struct MoeCase {
  std::string name;
  ops::RouterScore score;
  int64_t k;
  bool normalize;
  MoeBalancing balancing;
  double z;
  MlpActivation activation;
  bool shared;
  bool bias;
  bool overlap = false;  // the shared expert beside the dispatch
};

void check_moe_case(Context& ctx, const MoeCase& mc) {
  INFO(mc.name);
  MoeOptions o;
  o.experts = kE;
  o.top_k = mc.k;
  o.hidden = kF;
  o.score = mc.score;
  o.normalize = mc.normalize;
  o.balancing = mc.balancing;
  o.aux_loss_coeff = mc.balancing == MoeBalancing::None ? 0.0 : 0.7;
  o.z_loss_coeff = mc.z;
  o.expert_bias = mc.bias;
  const nn::InitRule init = nn::InitRule::normal(0, 0.02);
  nn::MoELayer layer(kC, o, mc.shared ? kShared : 0, mc.activation, init, init);
  setup(ctx, layer, 11);
  layer.set_shared_expert_overlap(mc.overlap);
  std::vector<float> bias;
  if (mc.bias) {
    bias = {0.3f, -0.2f, 0.1f, 0.0f};
    layer.expert_bias() = ops::from_host<float>(ctx, bias, Shape{kE});
  }
  const Tensor x = inputs(ctx, 5);
  const bool sigmoid = mc.score == ops::RouterScore::Sigmoid;
  REQUIRE(routing_margin(x, layer.router.weight().data, mc.k, bias, sigmoid) > 1e-3);

  GradCase c;
  c.name = mc.name;
  c.inputs = {x};
  c.params = layer.named_parameters();
  c.forward = [&](Graph& g, const std::vector<Tensor>& in) {
    layer.stats().reset();
    return layer(g, in[0]);
  };
  c.added_to_loss = [&] {
    const std::vector<double> losses = layer.stats().loss_values(ctx);
    return o.aux_loss_coeff * losses[0] + o.z_loss_coeff * losses[1];
  };
  check_gradients(ctx, c);
  // The last expert got no token, the others all of them.
  CHECK(layer.stats().counts[kE - 1] == 0.0);
  double total = 0;
  for (double n : layer.stats().counts) total += n;
  CHECK(total == double(kB * kT * mc.k));
  if (mc.balancing != MoeBalancing::None) CHECK(layer.stats().loss_values(ctx)[0] > 0);
}

TEST_CASE("moe layer: gradients against finite differences", "[nn][moe][gradcheck]") {
  Context ctx;
  const auto soft = ops::RouterScore::Softmax, sig = ops::RouterScore::Sigmoid;
  const auto swiglu = MlpActivation::SwiGLU, gelu = MlpActivation::Gelu;
  const MoeCase cases[] = {
      {"softmax k=1 aux_loss", soft, 1, true, MoeBalancing::AuxLoss, 0.0, swiglu, true, false},
      {"softmax k=2 aux_loss z", soft, 2, true, MoeBalancing::AuxLoss, 0.3, swiglu, true, false},
      {"softmax k=2 unnormalized seq_aux_loss", soft, 2, false, MoeBalancing::SeqAuxLoss, 0.0,
       swiglu, false, false},
      {"softmax k=1 none z", soft, 1, true, MoeBalancing::None, 0.3, swiglu, false, false},
      {"softmax k=2 none, GELU experts", soft, 2, true, MoeBalancing::None, 0.0, gelu, true,
       false},
      {"sigmoid k=1 aux_loss", sig, 1, true, MoeBalancing::AuxLoss, 0.0, swiglu, false, false},
      {"sigmoid k=2 seq_aux_loss z", sig, 2, true, MoeBalancing::SeqAuxLoss, 0.3, swiglu, true,
       false},
      {"sigmoid k=2 none, expert bias", sig, 2, true, MoeBalancing::None, 0.0, swiglu, false,
       true},
      {"sigmoid k=2 aux_loss, GELU experts, unnormalized", sig, 2, false, MoeBalancing::AuxLoss,
       0.3, gelu, true, false},
      {"softmax k=2 aux_loss z, shared expert overlapped", soft, 2, true, MoeBalancing::AuxLoss,
       0.3, swiglu, true, false, true},
      {"sigmoid k=2 seq_aux_loss, GELU, shared expert overlapped", sig, 2, true,
       MoeBalancing::SeqAuxLoss, 0.0, gelu, true, false, true},
  };
  for (const MoeCase& mc : cases) check_moe_case(ctx, mc);
}

TEST_CASE("moe losses: values on hand-made routings", "[nn][moe]") {
  Context ctx;
  // (4, 2) f64 scores or logits and (4, 1) choices.
  auto table = [&](const std::vector<double>& v) { return ops::from_vector(ctx, v, Shape{4, 2}, DType::f64); };
  auto choices = [&](const std::vector<int32_t>& v) { return ops::from_host<int32_t>(ctx, v, Shape{4, 1}); };
  auto value = [&](const Tensor& t) { return ops::to_vector<double>(ctx, t)[0]; };
  const Tensor zeros = table(std::vector<double>(8, 0.0));
  nn::MoeLossOptions o;
  o.balancing = MoeBalancing::AuxLoss;
  o.aux_coeff = 1.0;
  // Two experts, k = 1, four tokens split evenly with uniform scores: perfectly balanced.
  const Tensor even = table({0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5});
  const Tensor split = choices({0, 1, 0, 1}), all_first = choices({0, 0, 0, 0});
  CHECK(value(nn::moe_losses(ctx, even, zeros, split, o).aux) == Approx(1.0));
  // Every token to expert 0 whose score is 1: E * 1 * 1 = 2, the worst case.
  const Tensor first = table({1, 0, 1, 0, 1, 0, 1, 0});
  CHECK(value(nn::moe_losses(ctx, first, zeros, all_first, o).aux) == Approx(2.0));
  // Per sequence: two sequences of two tokens, each sequence balanced only over the whole.
  const Tensor peaked = table({1, 0, 1, 0, 0, 1, 0, 1});
  const Tensor halves = choices({0, 0, 1, 1});
  CHECK(value(nn::moe_losses(ctx, peaked, zeros, halves, o).aux) == Approx(1.0));
  o.balancing = MoeBalancing::SeqAuxLoss;
  o.sequences = 2;
  CHECK(value(nn::moe_losses(ctx, peaked, zeros, halves, o).aux) == Approx(2.0));
  o.sequences = 3;  // 4 tokens are not 3 sequences
  CHECK_THROWS_AS(nn::moe_losses(ctx, peaked, zeros, halves, o), ShapeError);
  // z-loss: logits all 0 over 2 experts: logsumexp = log 2; off without a coefficient.
  o.balancing = MoeBalancing::None;
  CHECK_FALSE(nn::moe_losses(ctx, even, zeros, split, o).z.defined());
  o.z_coeff = 1.0;
  const nn::MoeLosses z = nn::moe_losses(ctx, even, zeros, split, o);
  CHECK_FALSE(z.aux.defined());
  CHECK(value(z.z) == Approx(std::log(2.0) * std::log(2.0)));
  // Its gradient: 2 lse softmax / N = 2 log 2 * 0.5 / 4 per logit.
  for (double g : ops::to_vector<double>(ctx, z.dlogits)) CHECK(g == Approx(std::log(2.0) / 4));
  CHECK_THROWS_AS(nn::moe_balancing_from_name("switch"), ConfigError);
}

TEST_CASE("moe layer: one expert with k = 1 is the dense MLP", "[nn][moe]") {
  Context ctx;
  MoeOptions o;
  o.experts = 1;
  o.top_k = 1;
  o.hidden = kF;
  o.balancing = MoeBalancing::None;
  const nn::InitRule init = nn::InitRule::normal(0, 0.5);
  nn::MoELayer layer(kC, o, 0, MlpActivation::SwiGLU, init, init);
  nn::SwiGLUMLP dense(kC, kF, false, init, init);
  nn::materialize(ctx, layer, DType::f64, 3);
  nn::materialize(ctx, dense, DType::f64, 3);
  ops::copy(ctx, dense.gate_up.weight().data, layer.experts.fc().data.select(0, 0));
  ops::copy(ctx, dense.proj.weight().data, layer.experts.proj().data.select(0, 0));
  const Tensor x = inputs(ctx, 9);
  Graph g(ctx);
  autograd::NoGradGuard no_grad(g);
  const ops::Difference d = ops::compare(ctx, layer(g, x), dense(g, x));
  CHECK(d.max_abs < 1e-14);
}

// An expert-parallel group of one that copies and writes down what the layer asks of it.
struct RecordingExpertGroup : nn::ExpertParallelGroup {
  std::vector<std::string>* events;
  explicit RecordingExpertGroup(std::vector<std::string>* e) : events(e) {}
  int size() const override { return 1; }
  int rank() const override { return 0; }
  std::vector<int64_t> exchange_counts(Context&, const std::vector<int64_t>& counts) override {
    events->push_back("counts");
    return counts;
  }
  void exchange_rows(Context& ctx, const Tensor& send, const std::vector<size_t>&,
                     const Tensor& recv, const std::vector<size_t>&) override {
    ops::copy(ctx, recv, send);
  }
  struct Pending : nn::PendingTransfer {
    std::vector<std::string>* events;
    explicit Pending(std::vector<std::string>* e) : events(e) {}
    void finish(Context&) override { events->push_back("rows arrived"); }
  };
  std::unique_ptr<nn::PendingTransfer> start_exchange_rows(
      Context& ctx, const Tensor& send, const std::vector<size_t>&, const Tensor& recv,
      const std::vector<size_t>&) override {
    events->push_back("rows started");
    ops::copy(ctx, recv, send);
    return std::make_unique<Pending>(events);
  }
};

// With the shared expert overlapped, under expert parallelism it runs between the dispatch's
// start and its end (on GPUs the all-to-all runs beside it), and the layer computes what it
// computes without the group, bit for bit; without the overlap it runs after the routed
// experts. Backward exchanges the rows' gradients both ways, the inputs' gradients travelling
// home beside the shared expert's backward when it is overlapped.
TEST_CASE("moe layer: the shared expert runs while the rows travel to their experts",
          "[nn][moe]") {
  Context ctx;
  MoeOptions o;
  o.experts = kE;
  o.top_k = 2;
  o.hidden = kF;
  const nn::InitRule init = nn::InitRule::normal(0, 0.5);
  const Tensor x = inputs(ctx, 6);
  std::vector<std::string> events;
  // The layer's output and input gradient, with the group or without it.
  auto run = [&](bool overlap, bool with_group) {
    nn::MoELayer layer(kC, o, kShared, MlpActivation::SwiGLU, init, init);
    setup(ctx, layer, 4);
    layer.set_shared_expert_overlap(overlap);
    RecordingExpertGroup group(&events);
    if (with_group) layer.set_expert_parallel(&group);
    layer.shared_expert->add_hook(nn::HookPoint::PreForward, [&](nn::Module&, Graph& g) {
      if (!g.recomputing()) events.push_back("shared expert");
    });
    layer.shared_expert->add_hook(nn::HookPoint::PreBackward, [&](nn::Module&, Graph&) {
      events.push_back("shared expert backward");
    });
    events.clear();
    Graph g(ctx);
    const Tensor xl = Graph::leaf(ops::clone(ctx, x));
    const Tensor y = layer(g, xl);
    Tensor dy = ctx.empty(y.shape(), DType::f64);
    fill_random(ctx, dy, 8, 1.0);
    events.push_back("backward");
    g.backward(y, dy);
    return std::make_pair(ops::clone(ctx, y), ops::clone(ctx, Graph::grad(xl)));
  };
  const auto want = run(true, false);
  const auto got = run(true, true);
  // Forward: the dispatch beside the shared expert, then the combine. Backward: the rows'
  // gradients to the experts beside the router's backward, then the inputs' gradients home
  // beside the shared expert's backward.
  CHECK(events == std::vector<std::string>{"counts", "rows started", "shared expert",
                                           "rows arrived", "rows started", "rows arrived",
                                           "backward", "rows started", "rows arrived",
                                           "rows started", "shared expert backward",
                                           "rows arrived"});
  CHECK(ops::compare(ctx, got.first, want.first).max_abs == 0.0);
  CHECK(ops::compare(ctx, got.second, want.second).max_abs == 0.0);
  // Without the overlap: the shared expert after the routed experts' exchanges, the same
  // output (its input gradient sums in another order).
  const auto in_order = run(false, true);
  CHECK(events == std::vector<std::string>{"counts", "rows started", "rows arrived",
                                           "rows started", "rows arrived", "shared expert",
                                           "backward", "shared expert backward", "rows started",
                                           "rows arrived", "rows started", "rows arrived"});
  CHECK(ops::compare(ctx, in_order.first, want.first).max_abs == 0.0);
  CHECK(ops::compare(ctx, in_order.second, want.second).max_abs <= 1e-14);
}

TEST_CASE("moe layer: the expert bias moves toward the mean count", "[nn][moe]") {
  Context ctx;
  MoeOptions o;
  o.experts = 3;
  o.top_k = 1;
  o.hidden = 2;
  o.score = ops::RouterScore::Sigmoid;
  o.expert_bias = true;
  nn::MoELayer layer(4, o, 0, MlpActivation::SwiGLU, nn::InitRule::normal(0, 0.1),
                     nn::InitRule::normal(0, 0.1));
  nn::materialize(ctx, layer, DType::f64, 1);
  Graph g(ctx);
  autograd::NoGradGuard no_grad(g);
  Tensor x = ctx.empty(Shape{1, 6, 4}, DType::f64);
  fill_random(ctx, x, 2);
  layer(g, x);  // creates the bias, zero
  layer.update_expert_bias(ctx, {5, 1, 3}, 0.25);
  const std::vector<float> b = ops::to_vector<float>(ctx, layer.expert_bias());
  CHECK(b == std::vector<float>{-0.25f, 0.25f, 0.0f});
}

}  // namespace
}  // namespace fsdp::testing
