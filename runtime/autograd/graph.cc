#include "runtime/autograd/graph.h"

#include <utility>

#include "kernels/ops.h"

namespace fsdp::autograd {
namespace {

// Restores a bool member when a scope ends, also when an exception leaves it.
class FlagScope {
 public:
  FlagScope(bool& flag, bool value) : flag_(flag), saved_(flag) { flag = value; }
  ~FlagScope() { flag_ = saved_; }
  FlagScope(const FlagScope&) = delete;
  FlagScope& operator=(const FlagScope&) = delete;

 private:
  bool& flag_;
  bool saved_;
};

}  // namespace

std::vector<std::string> Graph::node_names() const {
  std::vector<std::string> names;
  names.reserve(tape_.size());
  for (const Node& n : tape_) names.push_back(n.name);
  return names;
}

Tensor Graph::leaf(const Tensor& t) {
  check_defined(t, "Graph::leaf");
  FSDP_CHECK(is_floating(t.dtype()), DTypeError, "Graph::leaf: only floating tensors take "
             "gradients, got ", t.str());
  Tensor out = t;
  auto meta = std::make_shared<AutogradMeta>();
  meta->is_leaf = true;
  out.set_autograd_meta(std::move(meta));
  return out;
}

Tensor Graph::grad(const Tensor& t) {
  return t.autograd_meta() ? t.autograd_meta()->grad : Tensor();
}

GradTarget Graph::target(const Tensor& t) {
  return GradTarget{t.autograd_meta(), t.shape(), t.dtype()};
}

bool Graph::should_record(std::initializer_list<const Tensor*> inputs, bool has_parameters) const {
  if (!grad_enabled_) return false;
  if (has_parameters) return true;
  for (const Tensor* t : inputs)
    if (t && tracked(*t)) return true;
  return false;
}

Tensor Graph::track(const Tensor& out) {
  Tensor t = out;
  t.set_autograd_meta(std::make_shared<AutogradMeta>());
  return t;
}

void Graph::record(std::string name, std::vector<std::shared_ptr<AutogradMeta>> outputs,
                   BackwardFn backward) {
  FSDP_CHECK(grad_enabled_, InternalError, "Graph::record(", name, ") while grad is disabled");
  tape_.push_back(Node{std::move(name), std::move(outputs), std::move(backward)});
}

Tensor Graph::grad_of(const std::shared_ptr<AutogradMeta>& meta) {
  return meta ? meta->grad : Tensor();
}

double Graph::scalar_grad_of(const std::shared_ptr<AutogradMeta>& meta) const {
  FSDP_CHECK(meta && meta->grad.defined(), InternalError, "scalar_grad_of: no gradient");
  FSDP_CHECK(meta->grad.numel() == 1, ShapeError, "scalar_grad_of: ", meta->grad.str(),
             " is not a one-element gradient");
  if (meta->grad_known_on_host) return meta->host_grad;
  return ops::item(ctx_, meta->grad);
}

void Graph::accumulate(const GradTarget& t, const Tensor& g) {
  const std::shared_ptr<AutogradMeta>& meta = t.meta;
  if (!meta || !g.defined()) return;
  meta->grad_known_on_host = false;
  FSDP_CHECK(g.shape() == t.shape && g.dtype() == t.dtype, ShapeError, "gradient ", g.str(),
             " for a tensor of shape ", t.shape, " and dtype ", dtype_name(t.dtype));
  if (!meta->grad.defined()) {
    meta->grad = g;
    meta->grad_owned = false;
    return;
  }
  if (!meta->grad_owned) {
    // Copy-on-write: the adopted tensor may be another tensor's gradient too.
    Tensor sum = ctx_.empty(t.shape, t.dtype);
    ops::add(ctx_, sum, meta->grad, g);
    meta->grad = sum;
    meta->grad_owned = true;
    return;
  }
  ops::add(ctx_, meta->grad, meta->grad, g);
}

GradSink Graph::grad_sink(const GradTarget& t) {
  const std::shared_ptr<AutogradMeta>& meta = t.meta;
  if (!meta) return {};
  meta->grad_known_on_host = false;  // the caller is about to write into the gradient
  if (!meta->grad.defined()) {
    meta->grad = ctx_.empty(t.shape, t.dtype);
    meta->grad_owned = true;
    return {meta->grad, false};
  }
  if (!meta->grad_owned || !meta->grad.is_contiguous()) {
    meta->grad = ops::clone(ctx_, meta->grad);
    meta->grad_owned = true;
  }
  return {meta->grad, true};
}

GradSink Graph::grad_sink_or_addend(const GradTarget& t) {
  const std::shared_ptr<AutogradMeta>& meta = t.meta;
  if (!meta || !meta->grad.defined() || (meta->grad_owned && meta->grad.is_contiguous()))
    return grad_sink(t);
  meta->grad_known_on_host = false;
  GradSink sink;
  sink.addend = ops::contiguous(ctx_, meta->grad);
  sink.buffer = ctx_.empty(t.shape, t.dtype);
  meta->grad = sink.buffer;
  meta->grad_owned = true;
  return sink;
}

void Graph::add_into(const GradSink& sink, const Tensor& tmp) {
  if (!sink.defined() || !sink.accumulate) return;
  ops::add(ctx_, sink.buffer, sink.buffer, tmp);
}

void Graph::backward(const Tensor& loss, double dloss_scale) {
  check_defined(loss, "backward: loss");
  FSDP_CHECK(loss.numel() == 1, ShapeError, "backward(loss, scale) needs a one-element loss, got ",
             loss.str(), "; pass a gradient tensor instead");
  Tensor seed = ctx_.empty(loss.shape(), loss.dtype());
  ops::fill(ctx_, seed, dloss_scale);
  run_backward(loss, seed, &dloss_scale);
}

void Graph::backward(const Tensor& out, const Tensor& dout) { run_backward(out, dout, nullptr); }

void Graph::run_backward(const Tensor& out, const Tensor& dout, const double* host_value) {
  FSDP_CHECK(!in_backward_, ValueError, "backward() called from inside backward()");
  FSDP_CHECK(tracked(out), ValueError, "backward(): ", out.str(),
             " is not tracked (was it computed with grad disabled, or is it a view?)");
  FSDP_CHECK(!tape_.empty(), ValueError, "backward(): the tape is empty (backward already ran "
             "for this forward, or nothing was recorded)");
  FSDP_CHECK(dout.shape() == out.shape(), ShapeError, "backward(): gradient ", dout.str(),
             " for ", out.str());
  Tensor seed = dout.dtype() == out.dtype() ? dout : ops::cast(ctx_, dout, out.dtype());
  const bool first_gradient = !out.autograd_meta()->grad.defined();
  accumulate(out, seed);
  if (host_value && first_gradient) {  // the gradient is exactly the seed
    out.autograd_meta()->grad_known_on_host = true;
    out.autograd_meta()->host_grad = *host_value;
  }
  // The tape is moved out first: nodes run from a local vector, so recompute can record a
  // nested tape into tape_, and an exception leaves the graph empty rather than half-run.
  std::vector<Node> tape = std::move(tape_);
  tape_.clear();
  FlagScope in_backward(in_backward_, true);
  run_tape(tape);
}

void Graph::run_tape(std::vector<Node>& tape) {
  while (!tape.empty()) {
    {
      Node& node = tape.back();
      node.backward(*this);
      for (const std::shared_ptr<AutogradMeta>& m : node.outputs)
        if (m && !m->is_leaf) {
          m->grad = Tensor();  // consumed: free it now rather than at the end of backward
          m->grad_owned = false;
        }
    }
    tape.pop_back();  // frees what the node saved for backward
  }
}

void Graph::run_nested(const std::function<void()>& forward, const std::function<void()>& seed) {
  std::vector<Node> outer = std::move(tape_);
  tape_.clear();
  std::vector<Node> nested;
  try {
    {
      FlagScope recording(grad_enabled_, true);
      FlagScope recomputing(recomputing_, true);
      forward();
    }
    nested = std::move(tape_);
    tape_.clear();
    seed();
    run_tape(nested);
  } catch (...) {
    tape_ = std::move(outer);
    throw;
  }
  tape_ = std::move(outer);
}

}  // namespace fsdp::autograd
