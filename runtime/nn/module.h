// Module: a named node of a model's tree, owning parameters and child modules, with the
// hooks through which FSDP attaches from outside.
//
// Names. A module is registered under its parent with a local name; its name() is the full
// dotted path from the root ("h.3.attn"; the root's is ""), and every parameter's name() is
// that path plus the parameter's local name ("h.3.attn.qkv.weight").
//
// Hooks. Each module has four hook points, each a list of functions called in registration
// order with (module, graph):
//   PreForward   on the host, before the module's forward runs;
//   PostForward  on the host, after it returns;
//   PreBackward  from the tape, before any backward op of the module's forward runs;
//   PostBackward from the tape, after every backward op of the module's forward ran: all of
//                its parameters' gradients for this backward are final.
// The backward points work through two marker nodes recorded around the forward (only when
// grad is enabled and the module has backward hooks at that time): one recorded when the
// forward starts (whose backward, run last since the tape runs in reverse, fires
// PostBackward) and one when it ends (fired first: PreBackward). Hooks may wait on and issue
// stream work. With activation recompute (set_recompute), the unit's forward is re-run inside
// backward between those two markers; it calls PreForward/PostForward again while
// graph.recomputing() is true, so a hook can tell the two apart.
//
// Modules never mention sharding; they are not copyable or movable (their children and
// parameters are registered by address).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "runtime/autograd/graph.h"
#include "runtime/nn/parameter.h"

namespace fsdp::nn {

using autograd::Graph;

enum class HookPoint : uint8_t { PreForward, PostForward, PreBackward, PostBackward };
const char* hook_point_name(HookPoint p);

class Module;
using Hook = std::function<void(Module&, Graph&)>;
using HookId = uint64_t;

class Module {
 public:
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // What the module is: "linear", "layernorm", "attention", "mlp", "block", "gpt2", ...
  // Transformer blocks report "block": FSDP picks its default units by kind.
  virtual std::string kind() const = 0;
  // Full dotted path from the root ("" for the root itself).
  const std::string& name() const { return name_; }

  // ---- the tree
  const std::vector<Module*>& children() const { return children_; }
  // This module and every descendant, parents before children, in registration order.
  std::vector<Module*> modules();
  std::vector<Module*> modules_of_kind(const std::string& kind);
  // Every parameter of this subtree exactly once (a parameter reachable from two modules,
  // e.g. a tied embedding, is listed at its first occurrence), in a fixed order: a module's
  // own parameters in registration order, then its children's, depth first. Each one's
  // name() is its full dotted name.
  std::vector<Parameter*> named_parameters();
  // The parameters registered directly on this module.
  const std::vector<std::shared_ptr<Parameter>>& own_parameters() const { return params_; }
  // The parameter with this full name, or nullptr.
  Parameter* find_parameter(const std::string& full_name);
  // Total elements over named_parameters().
  int64_t num_parameters();

  // ---- hooks
  HookId add_hook(HookPoint point, Hook hook);
  void remove_hook(HookId id);  // unknown ids are ignored
  void clear_hooks();
  bool has_hooks(HookPoint point) const;
  // Calls the hooks of one point in registration order.
  void run_hooks(HookPoint point, Graph& graph);

  // ---- activation recompute (for modules whose forward is a function of one tensor)
  void set_recompute(bool on) { recompute_ = on; }
  bool recompute() const { return recompute_; }

 protected:
  Module() = default;

  // Registers a new parameter (a spec: no memory) under `local_name`.
  Parameter& add_parameter(const std::string& local_name, const Shape& shape, InitRule init,
                           bool weight_decay);
  // Registers `child` (owned by the caller, usually a member) under `local_name`.
  template <typename M>
  M& add_module(const std::string& local_name, M& child) {
    register_child(local_name, child);
    return child;
  }

  // Runs body() as this module's forward: PreForward hooks, the PostBackward marker, body,
  // the PreBackward marker, PostForward hooks.
  Tensor run_forward(Graph& graph, const std::function<Tensor()>& body);
  // The same for a forward that is a function of one tensor, honouring set_recompute():
  // `compute` must capture only `this` (it may run again inside backward).
  Tensor run_forward(Graph& graph, const Tensor& x,
                     const std::function<Tensor(Graph&, const Tensor&)>& compute);

 private:
  struct HookEntry {
    HookId id;
    HookPoint point;
    Hook fn;
  };
  void register_child(const std::string& local_name, Module& child);
  void set_name(const std::string& name);  // renames the subtree and its parameters
  void record_marker(Graph& graph, HookPoint point);
  void collect_parameters(std::vector<Parameter*>& out);

  std::string name_;
  std::string local_name_;
  Module* parent_ = nullptr;
  std::vector<Module*> children_;
  std::vector<std::shared_ptr<Parameter>> params_;
  // Local names already taken by children and by own parameters (registration checks them
  // in constant time: models have tens of thousands of modules).
  std::unordered_set<std::string> child_names_, param_names_;
  std::vector<HookEntry> hooks_;
  HookId next_hook_id_ = 1;
  bool recompute_ = false;
};

// A module whose forward maps one tensor to one tensor (layers, MLPs, attention, blocks):
// forward() runs compute() inside the hooks, recomputing it in backward if asked to.
class UnaryModule : public Module {
 public:
  Tensor forward(Graph& graph, const Tensor& x);
  Tensor operator()(Graph& graph, const Tensor& x) { return forward(graph, x); }

  // Differentiable transforms a parallel plan puts around the forward, from outside the
  // model (sequence parallelism splits the residual stream before the first block and
  // gathers it after the final norm): the input one runs before the module's hooks, the
  // output one after them; neither is re-run by activation recompute.
  using Transform = std::function<Tensor(Graph&, const Tensor&)>;
  void set_input_transform(Transform t) { input_transform_ = std::move(t); }
  void set_output_transform(Transform t) { output_transform_ = std::move(t); }

 protected:
  // The module's math. May be called twice per step under recompute: it must not keep
  // state between calls.
  virtual Tensor compute(Graph& graph, const Tensor& x) = 0;

 private:
  Transform input_transform_, output_transform_;
};

// "a.b" from "a" and "b" ("b" when the prefix is empty).
std::string join_name(const std::string& prefix, const std::string& local);

}  // namespace fsdp::nn
