#include "runtime/nn/module.h"

#include <algorithm>
#include <unordered_set>

#include "runtime/autograd/recompute.h"

namespace fsdp::nn {

const char* hook_point_name(HookPoint p) {
  switch (p) {
    case HookPoint::PreForward: return "pre_forward";
    case HookPoint::PostForward: return "post_forward";
    case HookPoint::PreBackward: return "pre_backward";
    case HookPoint::PostBackward: return "post_backward";
  }
  return "?";
}

std::string join_name(const std::string& prefix, const std::string& local) {
  return prefix.empty() ? local : prefix + "." + local;
}

// ---------------------------------------------------------------- the tree

std::vector<Module*> Module::modules() {
  std::vector<Module*> out{this};
  for (Module* c : children_) {
    std::vector<Module*> sub = c->modules();
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::vector<Module*> Module::modules_of_kind(const std::string& kind) {
  std::vector<Module*> out;
  for (Module* m : modules())
    if (m->kind() == kind) out.push_back(m);
  return out;
}

void Module::collect_parameters(std::vector<Parameter*>& out) {
  for (const auto& p : params_) out.push_back(p.get());
  for (Module* c : children_) c->collect_parameters(out);
}

std::vector<Parameter*> Module::named_parameters() {
  std::vector<Parameter*> all;
  collect_parameters(all);
  std::vector<Parameter*> out;
  std::unordered_set<const Parameter*> seen;
  for (Parameter* p : all)
    if (seen.insert(p).second) out.push_back(p);
  return out;
}

Parameter* Module::find_parameter(const std::string& full_name) {
  for (Parameter* p : named_parameters())
    if (p->name() == full_name) return p;
  return nullptr;
}

int64_t Module::num_parameters() {
  int64_t n = 0;
  for (Parameter* p : named_parameters()) n += p->numel();
  return n;
}

Parameter& Module::add_parameter(const std::string& local_name, const Shape& shape, InitRule init,
                                 bool weight_decay) {
  FSDP_CHECK(!local_name.empty() && local_name.find('.') == std::string::npos, ValueError,
             "module ", name_, ": bad parameter name '", local_name, "'");
  FSDP_CHECK(param_names_.insert(local_name).second, ValueError, "module ", name_,
             ": parameter '", local_name, "' registered twice");
  auto p = std::make_shared<Parameter>(local_name, shape, init, weight_decay);
  p->name_ = join_name(name_, local_name);
  params_.push_back(p);
  return *p;
}

void Module::register_child(const std::string& local_name, Module& child) {
  FSDP_CHECK(!local_name.empty(), ValueError, "module ", name_, ": empty child name");
  FSDP_CHECK(child.parent_ == nullptr, ValueError, "module '", local_name,
             "' is already registered under '", child.parent_ ? child.parent_->name_ : "", "'");
  FSDP_CHECK(child_names_.insert(local_name).second, ValueError, "module ", name_, ": child '",
             local_name, "' registered twice");
  child.parent_ = this;
  child.local_name_ = local_name;
  children_.push_back(&child);
  child.set_name(join_name(name_, local_name));
}

void Module::set_name(const std::string& name) {
  name_ = name;
  for (const auto& p : params_) p->name_ = join_name(name_, p->local_name());
  for (Module* c : children_) c->set_name(join_name(name_, c->local_name_));
}

// ---------------------------------------------------------------- hooks

HookId Module::add_hook(HookPoint point, Hook hook) {
  FSDP_CHECK(hook != nullptr, ValueError, "module ", name_, ": empty ", hook_point_name(point),
             " hook");
  const HookId id = next_hook_id_++;
  hooks_.push_back(HookEntry{id, point, std::move(hook)});
  return id;
}

void Module::remove_hook(HookId id) {
  hooks_.erase(std::remove_if(hooks_.begin(), hooks_.end(),
                              [id](const HookEntry& h) { return h.id == id; }),
               hooks_.end());
}

void Module::clear_hooks() { hooks_.clear(); }

bool Module::has_hooks(HookPoint point) const {
  for (const HookEntry& h : hooks_)
    if (h.point == point) return true;
  return false;
}

void Module::run_hooks(HookPoint point, Graph& graph) {
  // A copy: a hook may add or remove hooks.
  const std::vector<HookEntry> hooks = hooks_;
  for (const HookEntry& h : hooks)
    if (h.point == point) h.fn(*this, graph);
}

void Module::record_marker(Graph& graph, HookPoint point) {
  if (!graph.grad_enabled() || !has_hooks(point)) return;
  graph.record(str_cat(hook_point_name(point), ":", name_), {},
               [this, point](Graph& g) { run_hooks(point, g); });
}

// ---------------------------------------------------------------- forward

Tensor Module::run_forward(Graph& graph, const std::function<Tensor()>& body) {
  run_hooks(HookPoint::PreForward, graph);
  // Recorded first, so it runs last in backward: after all of this module's ops.
  record_marker(graph, HookPoint::PostBackward);
  Tensor y = body();
  // Recorded last, so it runs first in backward: before any of this module's ops.
  record_marker(graph, HookPoint::PreBackward);
  run_hooks(HookPoint::PostForward, graph);
  return y;
}

Tensor Module::run_forward(Graph& graph, const Tensor& x,
                           const std::function<Tensor(Graph&, const Tensor&)>& compute) {
  if (!recompute_ || !graph.grad_enabled())
    return run_forward(graph, [&] { return compute(graph, x); });
  run_hooks(HookPoint::PreForward, graph);
  record_marker(graph, HookPoint::PostBackward);
  // The first pass runs without recording and without hooks (they ran just above); the
  // second, inside backward, runs between this module's markers and calls the forward hooks
  // again with graph.recomputing() set.
  Tensor y = autograd::recompute(graph, name_, x, [this, compute](Graph& g, const Tensor& in) {
    if (g.recomputing()) run_hooks(HookPoint::PreForward, g);
    Tensor out = compute(g, in);
    if (g.recomputing()) run_hooks(HookPoint::PostForward, g);
    return out;
  });
  record_marker(graph, HookPoint::PreBackward);
  run_hooks(HookPoint::PostForward, graph);
  return y;
}

Tensor UnaryModule::forward(Graph& graph, const Tensor& x) {
  const Tensor in = input_transform_ ? input_transform_(graph, x) : x;
  const Tensor out =
      run_forward(graph, in, [this](Graph& g, const Tensor& t) { return compute(g, t); });
  return output_transform_ ? output_transform_(graph, out) : out;
}

}  // namespace fsdp::nn
