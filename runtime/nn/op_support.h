// Helpers shared by the differentiable ops' implementations (not a public header).
#pragma once

#include <functional>

#include "kernels/ops.h"
#include "runtime/autograd/graph.h"
#include "runtime/nn/parameter.h"

namespace fsdp::nn::detail {

using autograd::Graph;

// t (..., cols) as a contiguous (rows, cols) matrix: a view when t is contiguous.
inline Tensor rows(Context& ctx, const Tensor& t, int64_t cols) {
  const Tensor c = ops::contiguous(ctx, t);
  return c.view(Shape{c.numel() / cols, cols});
}

// How many of the i32 targets are not ignored (-1): the losses' mean divides by it. Reads
// the targets back to the host (callers that know it pass n_valid instead).
inline int64_t count_valid_targets(Context& ctx, const Tensor& targets) {
  int64_t n = 0;
  for (int32_t t : ops::to_vector<int32_t>(ctx, targets)) n += t != -1;
  return n;
}

// `shape` with its last dimension replaced by `last`.
inline Shape with_last(const Shape& shape, int64_t last) {
  std::vector<int64_t> dims = shape.dims();
  dims.back() = last;
  return Shape(dims);
}

// For kernels that can only OVERWRITE a gradient: calls write(dst) with x's gradient buffer
// when x has none yet, or with a temporary that is then added into it. No-op when x takes no
// gradient.
inline void overwrite_grad(Graph& g, const autograd::GradTarget& x,
                           const std::function<void(const Tensor&)>& write) {
  const autograd::GradSink sink = g.grad_sink(x);
  if (!sink.defined()) return;
  if (!sink.accumulate) {
    write(sink.buffer);
    return;
  }
  const Tensor tmp = g.ctx().empty(x.shape, x.dtype);
  write(tmp);
  g.add_into(sink, tmp);
}

// Throws unless x has the compute dtype of `p` (activations and weights share one dtype).
inline void check_compute_dtype(const Tensor& x, const Parameter& p, const char* op) {
  if (p.fp8 && p.fp8->gathered()) return;  // gathered in FP8: the FP8 product takes any input dtype
  FSDP_CHECK(x.dtype() == p.checked_data().dtype(), DTypeError, op, " ", p.name(), ": input ",
             x.str(), " does not have the weight's dtype ", dtype_name(p.data.dtype()));
}

// Throws unless x, a residual-stream tensor entering a norm, has the compute dtype of `p`
// or is f32 beside bf16 weights (an f32 residual stream).
inline void check_stream_dtype(const Tensor& x, const Parameter& p, const char* op) {
  const DType w = p.checked_data().dtype();
  FSDP_CHECK(x.dtype() == w || (x.dtype() == DType::f32 && w == DType::bf16), DTypeError, op, " ",
             p.name(), ": input ", x.str(), " has neither the weight's dtype ", dtype_name(w),
             " nor f32 beside bf16");
}

// A linear layer's parameter gradients: dW (out, in) += dy^T (out, N) @ x (N, in), and
// db (out) += the column sums of dy (in the same pass over dy where the backend can).
inline void weight_and_bias_grad(Context& ctx, Parameter& weight, Parameter* bias,
                                 const Tensor& dy, const Tensor& x) {
  if (bias)
    ops::matmul_bias_grad(ctx, weight.grad_for_accumulation(ctx), dy, x, true, false, 1.0, 1.0,
                          bias->grad_for_accumulation(ctx), true);
  else
    ops::matmul(ctx, weight.grad_for_accumulation(ctx), dy, x, true, false, 1.0, 1.0);
}

}  // namespace fsdp::nn::detail
