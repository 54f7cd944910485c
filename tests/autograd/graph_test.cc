// The tape itself: record order, gradient accumulation, copy-on-write of shared gradients,
// no-grad, clear(), errors, and activation recompute. The differentiable ops here are
// small test-only ones built from the basic kernels, so these tests do not depend on
// runtime/nn.
#include <memory>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "runtime/autograd/graph.h"
#include "runtime/autograd/recompute.h"
#include "tests/test_support.h"

namespace fsdp::autograd {
namespace {

Tensor vec(Context& ctx, const std::vector<double>& v) {
  return ops::from_vector(ctx, v, Shape{int64_t(v.size())}, DType::f64);
}
std::vector<double> values(Context& ctx, const Tensor& t) { return ops::to_vector<double>(ctx, t); }

// y = a * b elementwise; d a = dy * b, d b = dy * a. Logs its name when its backward runs.
Tensor mul(Graph& g, const Tensor& a, const Tensor& b, std::vector<std::string>* log = nullptr,
           const std::string& name = "mul") {
  Tensor y = g.ctx().empty(a.shape(), a.dtype());
  ops::mul(g.ctx(), y, a, b);
  if (!g.should_record({&a, &b}, false)) return y;
  y = Graph::track(y);
  g.record(name, {y.autograd_meta()},
           [a, b, ym = y.autograd_meta(), log, name](Graph& g) {
             if (log) log->push_back(name);
             const Tensor dy = Graph::grad_of(ym);
             if (!dy.defined()) return;
             Tensor da = g.ctx().empty(a.shape(), a.dtype());
             ops::mul(g.ctx(), da, dy, b);
             Tensor db = g.ctx().empty(b.shape(), b.dtype());
             ops::mul(g.ctx(), db, dy, a);
             g.accumulate(a, da);
             g.accumulate(b, db);
           });
  return y;
}

// y = a + b; both inputs adopt dy itself (no copy).
Tensor add(Graph& g, const Tensor& a, const Tensor& b) {
  Tensor y = g.ctx().empty(a.shape(), a.dtype());
  ops::add(g.ctx(), y, a, b);
  if (!g.should_record({&a, &b}, false)) return y;
  y = Graph::track(y);
  g.record("add", {y.autograd_meta()},
           [ta = Graph::target(a), tb = Graph::target(b), ym = y.autograd_meta()](Graph& g) {
             g.accumulate(ta, Graph::grad_of(ym));
             g.accumulate(tb, Graph::grad_of(ym));
           });
  return y;
}

// y = s * x, writing its gradient through a GradSink with ops::axpby (accumulating when the
// sink says so).
Tensor scale(Graph& g, const Tensor& x, double s) {
  Tensor y = g.ctx().empty(x.shape(), x.dtype());
  ops::scale(g.ctx(), y, x, s);
  if (!g.should_record({&x}, false)) return y;
  y = Graph::track(y);
  g.record("scale", {y.autograd_meta()}, [tx = Graph::target(x), ym = y.autograd_meta(), s](Graph& g) {
    const Tensor dy = Graph::grad_of(ym);
    if (!dy.defined()) return;
    const GradSink sink = g.grad_sink(tx);
    if (sink.defined()) ops::axpby(g.ctx(), sink.buffer, s, dy, sink.accumulate ? 1.0 : 0.0);
  });
  return y;
}

// y = s * x through grad_sink_or_addend: the kernel writes addend + s * dy (or accumulates).
Tensor scale_with_addend(Graph& g, const Tensor& x, double s, std::vector<bool>* used_addend) {
  Tensor y = g.ctx().empty(x.shape(), x.dtype());
  ops::scale(g.ctx(), y, x, s);
  if (!g.should_record({&x}, false)) return y;
  y = Graph::track(y);
  g.record("scale+", {y.autograd_meta()},
           [tx = Graph::target(x), ym = y.autograd_meta(), s, used_addend](Graph& g) {
             const Tensor dy = Graph::grad_of(ym);
             if (!dy.defined()) return;
             const GradSink sink = g.grad_sink_or_addend(tx);
             if (!sink.defined()) return;
             used_addend->push_back(sink.addend.defined());
             if (sink.addend.defined()) {
               REQUIRE_FALSE(sink.accumulate);
               REQUIRE(sink.addend.data_ptr() != sink.buffer.data_ptr());
               ops::copy(g.ctx(), sink.buffer, sink.addend);
               ops::axpby(g.ctx(), sink.buffer, s, dy, 1.0);
             } else {
               ops::axpby(g.ctx(), sink.buffer, s, dy, sink.accumulate ? 1.0 : 0.0);
             }
           });
  return y;
}

// Sum of all elements, as a one-element tensor; the gradient is the scalar broadcast.
Tensor sum(Graph& g, const Tensor& x) {
  Tensor y = ops::sum(g.ctx(), x);
  if (!g.should_record({&x}, false)) return y;
  y = Graph::track(y);
  g.record("sum", {y.autograd_meta()}, [tx = Graph::target(x), ym = y.autograd_meta()](Graph& g) {
    const double dy = g.scalar_grad_of(ym);
    g.accumulate(tx, ops::full(g.ctx(), tx.shape, tx.dtype, dy));
  });
  return y;
}

TEST_CASE("backward runs the tape in reverse record order and frees it", "[autograd]") {
  Context ctx;
  Graph g(ctx);
  std::vector<std::string> log;
  Tensor x = Graph::leaf(vec(ctx, {1, 2, 3}));
  Tensor a = mul(g, x, x, &log, "first");
  Tensor b = mul(g, a, x, &log, "second");
  Tensor c = mul(g, b, a, &log, "third");
  REQUIRE(g.num_nodes() == 3);
  REQUIRE(g.node_names() == std::vector<std::string>{"first", "second", "third"});
  g.backward(c, vec(ctx, {1, 1, 1}));
  CHECK(log == std::vector<std::string>{"third", "second", "first"});
  CHECK(g.num_nodes() == 0);
  // c = x^5: dc/dx = 5 x^4.
  CHECK(values(ctx, Graph::grad(x)) == std::vector<double>{5, 80, 405});
  // Intermediate gradients are released once their producer has run; leaves keep theirs.
  CHECK_FALSE(Graph::grad(a).defined());
  CHECK_FALSE(Graph::grad(b).defined());
}

TEST_CASE("a tensor with several consumers receives the sum of their gradients", "[autograd]") {
  Context ctx;
  Graph g(ctx);
  Tensor x = Graph::leaf(vec(ctx, {2, -1}));
  // y = 3x + x*x + x  ->  dy/dx = 3 + 2x + 1
  Tensor y = add(g, add(g, scale(g, x, 3.0), mul(g, x, x)), x);
  g.backward(y, vec(ctx, {1, 1}));
  CHECK(values(ctx, Graph::grad(x)) == std::vector<double>{8, 2});
}

TEST_CASE("an adopted gradient shared by two tensors is copied before it is added to",
          "[autograd]") {
  Context ctx;
  Graph g(ctx);
  Tensor a = Graph::leaf(vec(ctx, {1, 2}));
  Tensor b = Graph::leaf(vec(ctx, {3, 4}));
  // s = a + b adopts ds for both a and b; then a also gets 2 * ds through the sink of
  // scale(). If the sink wrote into the shared tensor, b's gradient would change too.
  Tensor s = add(g, a, b);
  Tensor t = scale(g, a, 2.0);
  Tensor y = add(g, s, t);
  g.backward(y, vec(ctx, {1, 10}));
  CHECK(values(ctx, Graph::grad(a)) == std::vector<double>{3, 30});
  CHECK(values(ctx, Graph::grad(b)) == std::vector<double>{1, 10});
}

TEST_CASE("grad_sink_or_addend reads an adopted gradient instead of copying it", "[autograd]") {
  Context ctx;
  Graph g(ctx);
  Tensor a = Graph::leaf(vec(ctx, {1, 2}));
  Tensor b = Graph::leaf(vec(ctx, {3, 4}));
  std::vector<bool> used_addend;
  // a's gradient from s = a + b is adopted (shared with b) before the scale's backward runs
  // (it was recorded first, so it runs last): that gradient becomes the addend, and b's
  // stays as it was.
  Tensor t = scale_with_addend(g, a, 2.0, &used_addend);
  Tensor s = add(g, a, b);
  Tensor y = add(g, s, t);
  g.backward(y, vec(ctx, {1, 10}));
  CHECK(values(ctx, Graph::grad(a)) == std::vector<double>{3, 30});
  CHECK(values(ctx, Graph::grad(b)) == std::vector<double>{1, 10});
  CHECK(used_addend == std::vector<bool>{true});
  // A first gradient, or one the tensor owns, needs no addend.
  Graph g2(ctx);
  Tensor x = Graph::leaf(vec(ctx, {1, -1}));
  used_addend.clear();
  Tensor z = scale_with_addend(g2, x, 3.0, &used_addend);
  g2.backward(z, vec(ctx, {1, 1}));
  CHECK(values(ctx, Graph::grad(x)) == std::vector<double>{3, 3});
  CHECK(used_addend == std::vector<bool>{false});
}

TEST_CASE("leaf gradients accumulate across backward calls", "[autograd]") {
  Context ctx;
  Graph g(ctx);
  Tensor x = Graph::leaf(vec(ctx, {1, 2}));
  g.backward(mul(g, x, x), vec(ctx, {1, 1}));
  CHECK(values(ctx, Graph::grad(x)) == std::vector<double>{2, 4});
  g.backward(scale(g, x, 5.0), vec(ctx, {1, 1}));
  CHECK(values(ctx, Graph::grad(x)) == std::vector<double>{7, 9});
}

TEST_CASE("the scalar seed of backward(loss, scale) reaches the loss node on the host",
          "[autograd]") {
  Context ctx;
  Graph g(ctx);
  Tensor x = Graph::leaf(vec(ctx, {1, 2, 3}));
  Tensor loss = sum(g, mul(g, x, x));
  g.backward(loss, 0.5);
  CHECK(values(ctx, Graph::grad(x)) == std::vector<double>{1, 2, 3});
}

TEST_CASE("no-grad records nothing and restores the previous state", "[autograd]") {
  Context ctx;
  Graph g(ctx);
  Tensor x = Graph::leaf(vec(ctx, {1, 2}));
  {
    NoGradGuard outer(g);
    CHECK_FALSE(g.grad_enabled());
    Tensor y = mul(g, x, x);
    CHECK_FALSE(Graph::tracked(y));
    {
      NoGradGuard inner(g);
      CHECK_FALSE(g.grad_enabled());
    }
    CHECK_FALSE(g.grad_enabled());
    CHECK(values(ctx, y) == std::vector<double>{1, 4});
  }
  CHECK(g.grad_enabled());
  CHECK(g.num_nodes() == 0);
  // Untracked inputs alone record nothing either.
  Tensor c = vec(ctx, {1, 1});
  Tensor z = mul(g, c, c);
  CHECK_FALSE(Graph::tracked(z));
  CHECK(g.num_nodes() == 0);
}

TEST_CASE("clear() frees the saved activations without running backward", "[autograd]") {
  Context ctx;
  Graph g(ctx);
  Tensor x = Graph::leaf(vec(ctx, {1, 2}));
  std::weak_ptr<Storage> saved;
  {
    Tensor a = mul(g, x, x);
    saved = a.storage();
    Tensor b = mul(g, a, a);  // saves a
  }
  CHECK_FALSE(saved.expired());
  g.clear();
  CHECK(saved.expired());
  CHECK(g.num_nodes() == 0);
  CHECK_FALSE(Graph::grad(x).defined());
}

TEST_CASE("misuse of backward raises clear errors", "[autograd]") {
  Context ctx;
  Graph g(ctx);
  Tensor x = Graph::leaf(vec(ctx, {1, 2}));
  Tensor y = mul(g, x, x);
  CHECK_THROWS_AS(g.backward(y, vec(ctx, {1, 1, 1})), ShapeError);
  CHECK_THROWS_AS(g.backward(vec(ctx, {1, 2}), vec(ctx, {1, 1})), ValueError);
  CHECK_THROWS_AS(g.backward(y, 1.0), ShapeError);  // not one element
  g.backward(y, vec(ctx, {1, 1}));
  CHECK_THROWS_AS(g.backward(y, vec(ctx, {1, 1})), ValueError);  // the tape is gone
  CHECK_THROWS_AS(Graph::leaf(ops::zeros(ctx, Shape{2}, DType::i32)), DTypeError);
}

TEST_CASE("an exception inside backward leaves the graph empty and usable", "[autograd]") {
  Context ctx;
  Graph g(ctx);
  Tensor x = Graph::leaf(vec(ctx, {1, 2}));
  Tensor y = mul(g, x, x);
  g.record("boom", {}, [](Graph&) { FSDP_THROW(ValueError, "boom"); });
  CHECK_THROWS_AS(g.backward(y, vec(ctx, {1, 1})), ValueError);
  CHECK_FALSE(g.in_backward());
  CHECK(g.num_nodes() == 0);
  Tensor z = mul(g, x, x);
  g.backward(z, vec(ctx, {1, 1}));
  CHECK(values(ctx, Graph::grad(x)) == std::vector<double>{2, 4});
}

TEST_CASE("recompute gives the same values and gradients, saving only the unit's input",
          "[autograd][recompute]") {
  Context ctx;
  // The unit: u(x) = (x * x) * w, with a leaf w standing in for a parameter.
  Tensor w = Graph::leaf(vec(ctx, {3, -2, 0.5}));
  std::vector<bool> recomputing_flags;
  std::weak_ptr<Storage> inner_activation;
  auto unit = [&](Graph& g, const Tensor& x) {
    recomputing_flags.push_back(g.recomputing());
    Tensor h = mul(g, x, x);
    inner_activation = h.storage();
    return mul(g, h, w);
  };
  const std::vector<double> x0{1, 2, 3};

  // Reference: the plain unit.
  Graph plain(ctx);
  Tensor xp = Graph::leaf(vec(ctx, x0));
  Tensor yp = scale(plain, unit(plain, scale(plain, xp, 2.0)), 1.0);
  plain.backward(yp, vec(ctx, {1, 1, 1}));
  const std::vector<double> dx_ref = values(ctx, Graph::grad(xp));
  const std::vector<double> dw_ref = values(ctx, Graph::grad(w));
  w = Graph::leaf(vec(ctx, {3, -2, 0.5}));  // fresh gradient
  recomputing_flags.clear();

  Graph g(ctx);
  Tensor x = Graph::leaf(vec(ctx, x0));
  Tensor x2 = scale(g, x, 2.0);
  Tensor y = recompute(g, "unit", x2, unit);
  Tensor out = scale(g, y, 1.0);
  CHECK(values(ctx, y) == values(ctx, yp));
  // One node for the whole unit, and its inner activation already freed.
  CHECK(g.node_names() == std::vector<std::string>{"scale", "recompute:unit", "scale"});
  CHECK(inner_activation.expired());
  CHECK(recomputing_flags == std::vector<bool>{false});
  g.backward(out, vec(ctx, {1, 1, 1}));
  CHECK(recomputing_flags == std::vector<bool>{false, true});
  CHECK(values(ctx, Graph::grad(x)) == dx_ref);
  CHECK(values(ctx, Graph::grad(w)) == dw_ref);
  CHECK_FALSE(g.recomputing());
  CHECK(g.num_nodes() == 0);
}

TEST_CASE("recompute without grad is a plain call", "[autograd][recompute]") {
  Context ctx;
  Graph g(ctx);
  int calls = 0;
  NoGradGuard no_grad(g);
  Tensor y = recompute(g, "unit", vec(ctx, {2}), [&](Graph& gr, const Tensor& x) {
    ++calls;
    return mul(gr, x, x);
  });
  CHECK(calls == 1);
  CHECK(g.num_nodes() == 0);
  CHECK(values(ctx, y) == std::vector<double>{4});
}

}  // namespace
}  // namespace fsdp::autograd
