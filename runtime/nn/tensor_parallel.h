// What tensor-parallel layers need to communicate, without the layers knowing how.
//
// A plan from outside the model (runtime/parallel) slices parameters (ParallelSlice) and
// gives layers a style and a TensorParallelGroup; runtime/nn stays free of communicators.
// The differentiable ops below are the two conjugate regions of Megatron's tensor
// parallelism:
//   enter: the input of a column-parallel layer. Forward: identity (every rank holds the
//          whole activation). Backward: the ranks' partial input gradients are summed.
//   leave: the output of a row-parallel layer. Forward: the ranks' partial outputs are
//          summed. Backward: identity.
#pragma once

#include "runtime/autograd/graph.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"
#include "runtime/nn/parameter.h"

namespace fsdp::nn {

using autograd::Graph;

class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // t (contiguous, on ctx's device) = the sum of t over the group, in place, queued on
  // ctx's stream. Every rank of the group calls it in the same order.
  virtual void all_reduce_sum(Context& ctx, const Tensor& t) = 0;
};

// How a layer is split over the tensor-parallel group.
enum class ParallelStyle : uint8_t {
  replicated,  // whole on every rank
  column,      // output features split: weight rows (and bias) sliced, input whole
  row,         // input features split: weight columns sliced, output summed, bias whole
};
const char* parallel_style_name(ParallelStyle s);  // "replicated", "column", "row"

// Identity forward; backward sums x's gradient over `group`.
Tensor tensor_parallel_enter(Graph& g, const Tensor& x, TensorParallelGroup& group);
// Forward sums y over `group` (into a new tensor); backward is the identity.
Tensor tensor_parallel_leave(Graph& g, const Tensor& y, TensorParallelGroup& group);
// y (..., N) + bias (N) broadcast over the rows; backward: bias.grad += column sums.
Tensor add_bias(Graph& g, const Tensor& y, Parameter& bias);

}  // namespace fsdp::nn
