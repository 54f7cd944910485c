// Graph: a tape-based autograd for the transformer ops of fsdp.cpp.
//
// This is deliberately not a general framework. Differentiable ops (runtime/nn/functional.h)
// run their forward kernel, then, when the graph is recording, give their output a fresh
// AutogradMeta and record() one Node: a backward function that reads the output's gradient
// and adds into the gradients of its inputs and parameters. backward() runs the tape strictly
// in reverse record order (deterministic: no dependency counting, no queues), then frees it.
//
// Gradients of intermediate tensors live in their AutogradMeta (a Tensor carries a pointer to
// it; views made by Tensor::view/slice/... drop it, so an op must take the whole tensor that
// an earlier op produced). The first gradient that reaches a tensor is adopted without a copy;
// a second one is added (copy-on-write if the first was adopted). Parameter gradients are
// not stored here: backward functions accumulate them into nn::Parameter::grad, which keeps
// its value across backward() calls (micro-batches) until its owner zeroes it.
//
// Everything is an explicit object: a Graph holds a Context&, its tape and its flags. There
// are no thread-locals or globals; several graphs may coexist.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp {

// The per-tensor autograd record (declared by runtime/core, defined here).
struct AutogradMeta {
  // The gradient of the loss with respect to the tensor, summed over its consumers.
  Tensor grad;
  // False while `grad` is a tensor adopted from elsewhere (the first gradient to arrive is
  // taken as is): it must be copied before anything is added into it.
  bool grad_owned = false;
  // A leaf made by Graph::leaf(): its gradient is kept after backward for the caller.
  bool is_leaf = false;
  // Set when `grad` is a one-element tensor whose value the host knows (the seed of
  // backward(loss, scale)): a node that needs the value as a host scalar (the loss) reads
  // it here instead of synchronizing with the device.
  bool grad_known_on_host = false;
  double host_grad = 0;
};

namespace autograd {

class Graph;

// Where a backward function sends the gradient of one of its inputs: the input's autograd
// record and its shape and dtype, without its data (capturing the input tensor itself would
// keep its activation memory alive until the node runs). `meta` is null when the input
// takes no gradient.
struct GradTarget {
  std::shared_ptr<AutogradMeta> meta;
  Shape shape;
  DType dtype = DType::f32;
  bool defined() const { return meta != nullptr; }
};

// A recorded node's backward: reads its outputs' gradients, writes its inputs'.
using BackwardFn = std::function<void(Graph&)>;

// Where an op writes the gradient of one input: `buffer` is contiguous, of the input's
// shape and dtype. accumulate == false: overwrite it (it is fresh, uninitialized);
// accumulate == true: add into it (it already holds another consumer's gradient).
// `buffer` is undefined when the input takes no gradient (it is not tracked).
struct GradSink {
  Tensor buffer;
  bool accumulate = false;
  // Only from grad_sink_or_addend: the gradient t holds already, to be read (never written)
  // and added to what the kernel writes into `buffer` (accumulate is then false).
  Tensor addend;
  bool defined() const { return buffer.defined(); }
};

class Graph {
 public:
  explicit Graph(Context& ctx) : ctx_(ctx) {}
  ~Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  Context& ctx() const { return ctx_; }

  // ---- state
  // Ops record nodes only while grad is enabled (NoGradGuard turns it off).
  bool grad_enabled() const { return grad_enabled_; }
  // True while activation recompute re-runs a unit's forward inside backward. Module hooks
  // read it (e.g. FSDP must not reshard a unit after its recomputed forward).
  bool recomputing() const { return recomputing_; }
  // True while backward() runs the tape.
  bool in_backward() const { return in_backward_; }
  // Nodes on the tape now, and their names in record order (for tests and debugging).
  size_t num_nodes() const { return tape_.size(); }
  std::vector<std::string> node_names() const;

  // ---- tensors and gradients
  // `t` as a leaf: gradients flowing to it are kept after backward(), readable by grad().
  // The returned tensor shares t's storage.
  static Tensor leaf(const Tensor& t);
  // Whether gradients flow to `t` (a leaf, or the output of a recorded op).
  static bool tracked(const Tensor& t) { return t.autograd_meta() != nullptr; }
  // The gradient accumulated into a tracked tensor, or an undefined tensor.
  static Tensor grad(const Tensor& t);
  // The gradient target of `t` (see GradTarget).
  static GradTarget target(const Tensor& t);

  // ---- recording (used by differentiable ops)
  // Whether an op with these inputs should record a node: grad is enabled and either an
  // input is tracked or the op has parameters.
  bool should_record(std::initializer_list<const Tensor*> inputs, bool has_parameters) const;
  // `out` with a fresh AutogradMeta: gradients written for it by later nodes are found by
  // the node that produced it. Returns a tensor sharing out's storage.
  static Tensor track(const Tensor& out);
  // Appends a node. `outputs` are the metas of the tensors the node produced: after the
  // node's backward has run, their gradients are released (unless they are leaves).
  void record(std::string name, std::vector<std::shared_ptr<AutogradMeta>> outputs,
              BackwardFn backward);

  // ---- inside backward functions
  // The gradient that has reached the tensor owning `meta` (undefined if none did: the
  // node may then skip its work).
  static Tensor grad_of(const std::shared_ptr<AutogradMeta>& meta);
  // The value of a one-element gradient on the host: known without a device round trip
  // when it is backward()'s scalar seed, read back (synchronizing) otherwise.
  double scalar_grad_of(const std::shared_ptr<AutogradMeta>& meta) const;
  // Adds `g` into the gradient of `t` (ignored when t is not tracked). The first gradient
  // is adopted without a copy; the caller must not modify `g` afterwards.
  void accumulate(const GradTarget& t, const Tensor& g);
  void accumulate(const Tensor& t, const Tensor& g) { accumulate(target(t), g); }
  // A buffer for an op's kernel to write t's gradient into (see GradSink).
  GradSink grad_sink(const GradTarget& t);
  GradSink grad_sink(const Tensor& t) { return grad_sink(target(t)); }
  // The same for kernels that can write addend + their result: where grad_sink would copy an
  // adopted (shared) gradient to add into, the sink is a fresh buffer and the adopted
  // gradient its read-only `addend`, saving the copy (a residual stream's gradient reaches
  // each norm's input this way, adopted from the residual add).
  GradSink grad_sink_or_addend(const GradTarget& t);
  // Finishes a sink that was written through a temporary because the kernel can only
  // overwrite: adds `tmp` into the sink (when sink.accumulate) or is a no-op.
  void add_into(const GradSink& sink, const Tensor& tmp);

  // ---- backward
  // Runs the tape in reverse with d(loss) = dloss_scale (loss is a one-element tensor),
  // then frees the tape. Parameter gradients are ACCUMULATED into their grads.
  void backward(const Tensor& loss, double dloss_scale = 1.0);
  // Same, seeding the gradient of any tracked tensor `out` with `dout` (same shape).
  void backward(const Tensor& out, const Tensor& dout);
  // Drops the tape without running it: frees every saved activation.
  void clear() { tape_.clear(); }

  // ---- for activation recompute (runtime/autograd/recompute.h)
  // Runs `forward` with recording on, onto a fresh tape, with recomputing() true; then runs
  // that tape's backward and restores the outer tape. `seed` is called between the two
  // (after forward, before backward) to hand the nested outputs their gradients.
  void run_nested(const std::function<void()>& forward, const std::function<void()>& seed);

 private:
  friend class NoGradGuard;
  struct Node {
    std::string name;
    std::vector<std::shared_ptr<AutogradMeta>> outputs;
    BackwardFn backward;
  };
  void run_backward(const Tensor& out, const Tensor& dout, const double* host_value);
  // Runs `tape` from its last node to its first, destroying each node once run.
  void run_tape(std::vector<Node>& tape);

  Context& ctx_;
  std::vector<Node> tape_;
  bool grad_enabled_ = true;
  bool recomputing_ = false;
  bool in_backward_ = false;
};

// Turns recording off on `graph` for the guard's lifetime (evaluation, generation, the
// non-recording forward of a recomputed unit).
class NoGradGuard {
 public:
  explicit NoGradGuard(Graph& graph) : graph_(graph), saved_(graph.grad_enabled_) {
    graph.grad_enabled_ = false;
  }
  ~NoGradGuard() { graph_.grad_enabled_ = saved_; }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  Graph& graph_;
  bool saved_;
};

}  // namespace autograd
}  // namespace fsdp
