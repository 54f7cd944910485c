// Module hooks, the way FSDP uses them: the order of pre/post forward and pre/post backward
// hooks around a unit's own backward ops, with and without activation recompute; parameter
// gradients final at post-backward; and hooks outside recording.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "models/factory.h"
#include "runtime/nn/functional.h"
#include "runtime/nn/init.h"
#include "runtime/nn/layers.h"
#include "tests/test_support.h"

namespace fsdp::nn {
namespace {

using Log = std::vector<std::string>;

// Identity whose backward logs "op <label>": a marker for where a unit's own backward ops
// run relative to the hooks.
Tensor probe(Graph& g, const Tensor& x, Log* log, const std::string& label) {
  Tensor y = ops::clone(g.ctx(), x);
  if (!g.should_record({&x}, false)) return y;
  y = Graph::track(y);
  g.record("probe", {y.autograd_meta()},
           [tx = Graph::target(x), ym = y.autograd_meta(), log, label](Graph& g) {
             log->push_back("op " + label);
             g.accumulate(tx, Graph::grad_of(ym));
           });
  return y;
}

// x + lin(x), between two probes.
class ToyBlock : public UnaryModule {
 public:
  ToyBlock(int64_t dim, Log* log) : lin(dim, dim, true, InitRule::normal(0, 0.5)), log_(log) {
    add_module("lin", lin);
  }
  std::string kind() const override { return "block"; }
  Linear lin;

 protected:
  Tensor compute(Graph& g, const Tensor& x) override {
    const Tensor in = probe(g, x, log_, name() + " in");
    const Tensor out = add(g, in, lin(g, in));
    return probe(g, out, log_, name() + " out");
  }

 private:
  Log* log_;
};

class ToyModel : public Module {
 public:
  ToyModel(int64_t dim, int n_blocks, Log* log) {
    add_module("h", h);
    for (int i = 0; i < n_blocks; ++i) h.append(std::make_unique<ToyBlock>(dim, log));
  }
  std::string kind() const override { return "toy"; }
  Tensor forward(Graph& g, const Tensor& x) {
    return run_forward(g, [&] {
      Tensor y = x;
      for (size_t i = 0; i < h.size(); ++i) y = static_cast<ToyBlock&>(h[i])(g, y);
      return y;
    });
  }
  ToyBlock& block(size_t i) { return static_cast<ToyBlock&>(h[i]); }
  ModuleList h;
};

// Hooks on `m` that log "<point> <name>", with " (recompute)" while the graph recomputes.
void log_hooks(Module& m, Log* log) {
  for (HookPoint p : {HookPoint::PreForward, HookPoint::PostForward, HookPoint::PreBackward,
                      HookPoint::PostBackward})
    m.add_hook(p, [log, p](Module& mod, Graph& g) {
      log->push_back(std::string(hook_point_name(p)) + " " +
                     (mod.name().empty() ? "root" : mod.name()) +
                     (g.recomputing() ? " (recompute)" : ""));
    });
}

struct Fixture {
  Context ctx;
  Log log;
  ToyModel model{4, 2, &log};
  Tensor x;
  Fixture() {
    materialize(ctx, model, DType::f64, 7);
    x = Graph::leaf(ops::from_vector(ctx, {1, -2, 0.5, 3, 0.25, -1, 2, 1}, Shape{2, 4}, DType::f64));
  }
  void step(Graph& g) {
    const Tensor y = model.forward(g, x);
    log.push_back("-- backward");
    g.backward(y, ops::full(ctx, y.shape(), DType::f64, 1.0));
  }
};

TEST_CASE("hooks fire around each unit's forward and its own backward ops", "[nn][hooks]") {
  Fixture f;
  log_hooks(f.model, &f.log);
  for (size_t i = 0; i < 2; ++i) log_hooks(f.model.block(i), &f.log);
  Graph g(f.ctx);
  f.step(g);
  CHECK(f.log == Log{
                     "pre_forward root",
                     "pre_forward h.0",
                     "post_forward h.0",
                     "pre_forward h.1",
                     "post_forward h.1",
                     "post_forward root",
                     "-- backward",
                     "pre_backward root",
                     "pre_backward h.1",
                     "op h.1 out",
                     "op h.1 in",
                     "post_backward h.1",
                     "pre_backward h.0",
                     "op h.0 out",
                     "op h.0 in",
                     "post_backward h.0",
                     "post_backward root",
                 });
}

TEST_CASE("with recompute the forward hooks run again between the backward markers",
          "[nn][hooks][recompute]") {
  Fixture f;
  log_hooks(f.model, &f.log);
  for (size_t i = 0; i < 2; ++i) {
    log_hooks(f.model.block(i), &f.log);
    f.model.block(i).set_recompute(true);
  }
  log_hooks(f.model.block(0).lin, &f.log);  // a hooked module inside a recomputed unit
  Graph g(f.ctx);
  f.step(g);
  CHECK(f.log == Log{
                     "pre_forward root",
                     "pre_forward h.0",
                     "pre_forward h.0.lin",
                     "post_forward h.0.lin",
                     "post_forward h.0",
                     "pre_forward h.1",
                     "post_forward h.1",
                     "post_forward root",
                     "-- backward",
                     "pre_backward root",
                     "pre_backward h.1",
                     "pre_forward h.1 (recompute)",
                     "post_forward h.1 (recompute)",
                     "op h.1 out",
                     "op h.1 in",
                     "post_backward h.1",
                     "pre_backward h.0",
                     "pre_forward h.0 (recompute)",
                     "pre_forward h.0.lin (recompute)",
                     "post_forward h.0.lin (recompute)",
                     "post_forward h.0 (recompute)",
                     "op h.0 out",
                     "pre_backward h.0.lin",
                     "post_backward h.0.lin",
                     "op h.0 in",
                     "post_backward h.0",
                     "post_backward root",
                 });
}

TEST_CASE("parameter gradients are final at post-backward, untouched at pre-backward",
          "[nn][hooks]") {
  const bool recompute = GENERATE(false, true);
  INFO("recompute=" << recompute);
  Fixture f;
  std::map<std::string, std::vector<double>> at_post;
  std::map<std::string, bool> defined_at_pre;
  for (size_t i = 0; i < 2; ++i) {
    ToyBlock& b = f.model.block(i);
    b.set_recompute(recompute);
    b.add_hook(HookPoint::PreBackward, [&](Module& m, Graph&) {
      for (Parameter* p : m.named_parameters()) defined_at_pre[p->name()] = p->grad.defined();
    });
    b.add_hook(HookPoint::PostBackward, [&](Module& m, Graph&) {
      for (Parameter* p : m.named_parameters())
        at_post[p->name()] = ops::to_vector<double>(f.ctx, p->grad);
    });
  }
  Graph g(f.ctx);
  f.step(g);
  REQUIRE(at_post.size() == 4);
  for (Parameter* p : f.model.named_parameters()) {
    INFO(p->name());
    CHECK_FALSE(defined_at_pre.at(p->name()));
    CHECK(at_post.at(p->name()) == ops::to_vector<double>(f.ctx, p->grad));
  }
}

TEST_CASE("a post-backward hook may take a unit's gradients away", "[nn][hooks]") {
  // As FSDP does after issuing a reduce-scatter: nothing later in backward writes them.
  Fixture f;
  std::vector<double> taken;
  f.model.block(1).add_hook(HookPoint::PostBackward, [&](Module& m, Graph&) {
    Parameter& w = static_cast<ToyBlock&>(m).lin.weight();
    taken = ops::to_vector<double>(f.ctx, w.grad);
    w.grad = Tensor();
  });
  Graph g(f.ctx);
  f.step(g);
  CHECK_FALSE(f.model.block(1).lin.weight().grad.defined());
  CHECK(f.model.block(0).lin.weight().grad.defined());
  CHECK(taken.size() == 16);
}

TEST_CASE("the tied embedding's gradient is final only at the root's post-backward",
          "[nn][hooks][models]") {
  Context ctx;
  models::ModelConfig c;
  c.family = models::Family::GPT2;
  c.n_layer = 2;
  c.d_model = 8;
  c.n_head = 2;
  c.vocab_size = 10;
  c.seq_len = 4;
  auto model = models::build_model(c);
  materialize(ctx, *model, DType::f64, 3);
  Parameter& wte = *model->find_parameter("wte.weight");
  std::vector<double> at_root_post;
  bool defined_in_blocks = false;
  model->blocks()[1]->add_hook(HookPoint::PreBackward, [&](Module&, Graph&) {
    defined_in_blocks = wte.grad.defined();  // the head's share has arrived already
  });
  model->add_hook(HookPoint::PostBackward, [&](Module&, Graph&) {
    at_root_post = ops::to_vector<double>(ctx, wte.grad);
  });
  const Tensor idx = ops::from_host<int32_t>(ctx, {1, 2, 3, 4, 5, 6, 7, 8}, Shape{2, 4});
  const Tensor tgt = ops::from_host<int32_t>(ctx, {2, 3, 4, 5, 6, 7, 8, 9}, Shape{2, 4});
  Graph g(ctx);
  g.backward(model->forward(g, idx, tgt), 1.0);
  CHECK(defined_in_blocks);
  CHECK(at_root_post == ops::to_vector<double>(ctx, wte.grad));
}

TEST_CASE("without grad, forward hooks run and no markers are recorded", "[nn][hooks]") {
  Fixture f;
  log_hooks(f.model, &f.log);
  log_hooks(f.model.block(0), &f.log);
  f.model.block(0).set_recompute(true);
  Graph g(f.ctx);
  autograd::NoGradGuard no_grad(g);
  f.model.forward(g, f.x);
  CHECK(g.num_nodes() == 0);
  CHECK(f.log == Log{"pre_forward root", "pre_forward h.0", "post_forward h.0",
                     "post_forward root"});
}

TEST_CASE("hooks run in registration order and can be removed", "[nn][hooks]") {
  Fixture f;
  ToyBlock& b = f.model.block(0);
  const HookId first = b.add_hook(HookPoint::PreForward, [&](Module&, Graph&) { f.log.push_back("a"); });
  b.add_hook(HookPoint::PreForward, [&](Module&, Graph&) { f.log.push_back("b"); });
  Graph g(f.ctx);
  autograd::NoGradGuard no_grad(g);
  f.model.forward(g, f.x);
  CHECK(f.log == Log{"a", "b"});
  b.remove_hook(first);
  f.log.clear();
  f.model.forward(g, f.x);
  CHECK(f.log == Log{"b"});
  CHECK(b.has_hooks(HookPoint::PreForward));
  CHECK_FALSE(b.has_hooks(HookPoint::PostBackward));
  b.clear_hooks();
  CHECK_FALSE(b.has_hooks(HookPoint::PreForward));
  CHECK_THROWS_AS(b.add_hook(HookPoint::PreForward, Hook()), ValueError);
}

}  // namespace
}  // namespace fsdp::nn
