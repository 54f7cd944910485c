#include "runtime/autograd/recompute.h"

#include <memory>
#include <utility>

namespace fsdp::autograd {

Tensor recompute(Graph& graph, const std::string& name, const Tensor& x, UnitForward fn) {
  if (!graph.grad_enabled()) return fn(graph, x);
  Tensor y;
  {
    NoGradGuard no_grad(graph);
    y = fn(graph, x);
  }
  check_defined(y, "recompute: the unit's output");
  y = Graph::track(y);
  // The node keeps y's meta (where its gradient arrives), never y's storage: that is the
  // activation memory recompute exists to free.
  std::shared_ptr<AutogradMeta> y_meta = y.autograd_meta();
  graph.record("recompute:" + name, {y_meta}, [name, x, y_meta, fn = std::move(fn)](Graph& g) {
    const Tensor dy = Graph::grad_of(y_meta);
    if (!dy.defined()) return;  // nothing downstream used the unit's output
    // A fresh record for the input, so the nested tape's gradient for it is collected here
    // and then added into the outer x's (which may have other consumers).
    const Tensor x_in = Graph::tracked(x) ? Graph::track(x) : x;
    Tensor y2;
    g.run_nested([&] { y2 = fn(g, x_in); },
                 [&] {
                   FSDP_CHECK(y2.shape() == dy.shape(), InternalError, "recompute:", name, ": the recomputed output ",
                              y2.str(), " differs in shape from the first, ", dy.str());
                   g.accumulate(y2, dy);
                 });
    if (Graph::tracked(x)) g.accumulate(x, Graph::grad(x_in));
  });
  return y;
}

}  // namespace fsdp::autograd
