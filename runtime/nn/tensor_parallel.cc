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

namespace {

void check_sequence(const Tensor& x, int parts, const char* what) {
  FSDP_CHECK(x.dim() == 3 && x.size(1) % parts == 0, ShapeError, what, ": ", x.str(),
             " must be (B, T, C) with T divisible by the ", parts, " tensor-parallel ranks");
}

// x (B, T/tp, C) of every rank -> (B, T, C), the ranks' parts in order along T.
Tensor gather_sequence(Context& ctx, const Tensor& x, TensorParallelGroup& group) {
  const int tp = group.size();
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
  const Tensor parts = ctx.empty(Shape{tp, b, t, c}, x.dtype());  // rank-major
  group.all_gather(ctx, parts.flatten(), ops::contiguous(ctx, x).flatten());
  const Tensor out = ctx.empty(Shape{b, tp * t, c}, x.dtype());
  ops::copy(ctx, out.view(Shape{b, tp, t, c}), parts.permute({1, 0, 2, 3}));
  return out;
}

// y (B, T, C) of every rank -> this rank's (B, T/tp, C) of the sum over ranks.
Tensor reduce_scatter_sequence(Context& ctx, const Tensor& y, TensorParallelGroup& group) {
  const int tp = group.size();
  const int64_t b = y.size(0), t = y.size(1) / tp, c = y.size(2);
  const Tensor parts = ctx.empty(Shape{tp, b, t, c}, y.dtype());  // rank-major
  ops::copy(ctx, parts, ops::contiguous(ctx, y).view(Shape{b, tp, t, c}).permute({1, 0, 2, 3}));
  const Tensor out = ctx.empty(Shape{b, t, c}, y.dtype());
  group.reduce_scatter_sum(ctx, out.flatten(), parts.flatten());
  return out;
}

// This rank's (B, T/tp, C) of x (B, T, C), copied.
Tensor split_sequence(Context& ctx, const Tensor& x, TensorParallelGroup& group) {
  const int64_t t = x.size(1) / group.size();
  return ops::clone(ctx, x.narrow(1, group.rank() * t, t));
}

// Records `out`, a new tensor computed from x, whose backward sends back(dout) to x.
using Backward = Tensor (*)(Context&, const Tensor&, TensorParallelGroup&);
Tensor record(Graph& g, const Tensor& x, Tensor out, const char* name, TensorParallelGroup& group,
              Backward back) {
  if (!g.should_record({&x}, false)) return out;
  out = Graph::track(out);
  g.record(name, {out.autograd_meta()},
           [tx = Graph::target(x), om = out.autograd_meta(), grp = &group, back](Graph& g) {
             const Tensor dout = Graph::grad_of(om);
             if (dout.defined()) g.accumulate(tx, back(g.ctx(), dout, *grp));
           });
  return out;
}

// The identity's backward: the gradient adopted as it is (accumulate copies on write).
Tensor pass(Context&, const Tensor& dout, TensorParallelGroup&) { return dout; }

}  // namespace

Tensor tensor_parallel_enter(Graph& g, const Tensor& x, TensorParallelGroup& group, bool sequence) {
  if (sequence) check_sequence(x, 1, "tensor_parallel_enter");
  Tensor out = sequence ? gather_sequence(g.ctx(), x, group) : x;
  if (!g.should_record({&x}, false)) return out;
  // A new handle on the data: later nodes send their (partial) gradients to it.
  out = Graph::track(out.view(out.shape()));
  TensorParallelGroup* grp = &group;
  g.record(sequence ? "sequence_parallel_enter" : "tensor_parallel_enter", {out.autograd_meta()},
           [tx = Graph::target(x), om = out.autograd_meta(), grp, sequence](Graph& g) {
             const Tensor dout = Graph::grad_of(om);
             if (!dout.defined()) return;
             if (sequence) {
               g.accumulate(tx, reduce_scatter_sequence(g.ctx(), dout, *grp));
               return;
             }
             // The gradient is adopted by x below: sum a copy, never a buffer another node
             // may still read.
             Tensor d = ops::clone(g.ctx(), dout);
             grp->all_reduce_sum(g.ctx(), d);
             g.accumulate(tx, d);
           });
  return out;
}

Tensor tensor_parallel_leave(Graph& g, const Tensor& y, TensorParallelGroup& group, bool sequence) {
  if (sequence) {
    check_sequence(y, group.size(), "tensor_parallel_leave");
    return record(g, y, reduce_scatter_sequence(g.ctx(), y, group), "sequence_parallel_leave",
                  group, gather_sequence);
  }
  const Tensor sum = ops::clone(g.ctx(), y);  // contiguous
  group.all_reduce_sum(g.ctx(), sum);
  return record(g, y, sum, "tensor_parallel_leave", group, pass);
}

Tensor sequence_split(Graph& g, const Tensor& x, TensorParallelGroup& group) {
  check_sequence(x, group.size(), "sequence_split");
  return record(g, x, split_sequence(g.ctx(), x, group), "sequence_split", group, gather_sequence);
}

Tensor sequence_gather(Graph& g, const Tensor& x, TensorParallelGroup& group) {
  check_sequence(x, 1, "sequence_gather");
  return record(g, x, gather_sequence(g.ctx(), x, group), "sequence_gather", group, split_sequence);
}

namespace {
struct CompletedTransfer : PendingTransfer {
  void finish(Context&) override {}
};
}  // namespace

std::unique_ptr<PendingTransfer> TensorParallelGroup::start_send_recv(Context& ctx,
                                                                      const Tensor& send, int to,
                                                                      const Tensor& recv, int from) {
  send_recv(ctx, send, to, recv, from);
  return std::make_unique<CompletedTransfer>();
}

ops::VocabShard vocab_shard(const Parameter& table) {
  const auto& slice = table.parallel_slice();
  FSDP_CHECK(slice && slice->dim == 0 && slice->ranges.size() == 1, ShapeError, "vocabulary-"
             "parallel table ", table.name(), " must hold one range of rows, has ",
             slice ? slice->str() : std::string("no slice"));
  return {slice->ranges[0].first, slice->full_shape[0]};
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
