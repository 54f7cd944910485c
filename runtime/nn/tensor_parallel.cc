#include "runtime/nn/tensor_parallel.h"

#include "kernels/nn_ops.h"
#include "kernels/ops.h"
#include "runtime/nn/op_support.h"

namespace fsdp::nn {

const char* parallel_style_name(ParallelStyle s) {
  switch (s) {
    case ParallelStyle::replicated: return "replicated";
    case ParallelStyle::column: return "column";
    case ParallelStyle::row: return "row";
  }
  return "?";
}

Tensor tensor_parallel_enter(Graph& g, const Tensor& x, TensorParallelGroup& group) {
  if (!g.should_record({&x}, false)) return x;
  // A new handle on x's data: later nodes send their (partial) gradients to it.
  Tensor out = Graph::track(x.view(x.shape()));
  TensorParallelGroup* grp = &group;
  g.record("tensor_parallel_enter", {out.autograd_meta()},
           [tx = Graph::target(x), om = out.autograd_meta(), grp](Graph& g) {
             const Tensor dout = Graph::grad_of(om);
             if (!dout.defined()) return;
             // The gradient is adopted by x below: sum a copy, never a buffer another node
             // may still read.
             Tensor d = ops::clone(g.ctx(), dout);
             grp->all_reduce_sum(g.ctx(), d);
             g.accumulate(tx, d);
           });
  return out;
}

Tensor tensor_parallel_leave(Graph& g, const Tensor& y, TensorParallelGroup& group) {
  Tensor out = ops::clone(g.ctx(), y);  // contiguous
  group.all_reduce_sum(g.ctx(), out);
  if (!g.should_record({&y}, false)) return out;
  out = Graph::track(out);
  g.record("tensor_parallel_leave", {out.autograd_meta()},
           [ty = Graph::target(y), om = out.autograd_meta()](Graph& g) {
             const Tensor dout = Graph::grad_of(om);
             if (dout.defined()) g.accumulate(ty, dout);  // adopted: accumulate copies on write
           });
  return out;
}

Tensor add_bias(Graph& g, const Tensor& y, Parameter& bias) {
  Context& ctx = g.ctx();
  const Tensor& b = bias.checked_data();  // (N)
  const int64_t n = b.numel();
  FSDP_CHECK(b.dim() == 1 && y.dim() >= 1 && y.size(-1) == n, ShapeError, "add_bias ", bias.name(),
             ": ", y.str(), " does not end in the bias's ", n, " features");
  const Tensor y2 = detail::rows(ctx, y, n);  // (M, N)
  // The bias broadcast over the rows as a view with a zero row stride.
  const Tensor b2 = b.as_strided(Shape{y2.size(0), n}, Strides{0, 1}, b.offset());
  Tensor out = ctx.empty(y.shape(), y.dtype());
  ops::add(ctx, out.view(y2.shape()), y2, b2);
  if (!g.should_record({&y}, true)) return out;
  out = Graph::track(out);
  Parameter* bp = &bias;
  g.record("add_bias:" + bias.name(), {out.autograd_meta()},
           [ty = Graph::target(y), om = out.autograd_meta(), bp, n](Graph& g) {
             const Tensor dout = Graph::grad_of(om);
             if (!dout.defined()) return;
             Context& ctx = g.ctx();
             ops::bias_backward(ctx, bp->grad_for_accumulation(ctx), detail::rows(ctx, dout, n), true);
             g.accumulate(ty, dout);
           });
  return out;
}

}  // namespace fsdp::nn
