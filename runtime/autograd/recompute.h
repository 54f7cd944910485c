// Activation recompute: drop a unit's activations in forward, recompute them in backward.
#pragma once

#include <functional>
#include <string>

#include "runtime/autograd/graph.h"

namespace fsdp::autograd {

// A unit's forward as a function of its one input tensor.
using UnitForward = std::function<Tensor(Graph&, const Tensor&)>;

// Runs fn(graph, x) with recording off and records ONE node, "recompute:<name>", that saves
// only x. In backward that node re-runs fn(graph, x) with recording on, onto a nested tape,
// with graph.recomputing() true; hands the recomputed output the gradient that reached the
// returned tensor; runs the nested tape backward (parameter gradients accumulate as usual);
// and adds the gradient of the recomputed input into x's.
//
// fn is called twice, so it must depend only on x and on state that outlives backward: it
// captures the module (never locals by reference), and reads parameters at the time of each
// call (so FSDP may free a unit's gathered weights after forward and gather them again
// before the recompute). Without grad enabled this is just fn(graph, x).
Tensor recompute(Graph& graph, const std::string& name, const Tensor& x, UnitForward fn);

}  // namespace fsdp::autograd
