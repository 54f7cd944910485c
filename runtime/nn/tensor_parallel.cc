#include "runtime/nn/tensor_parallel.h"

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

Tensor gather_sequence(Context& ctx, const Tensor& x, ParallelGroup& group) {
  return SequenceExchange::start_gather(ctx, x, group).finish(ctx);
}

Tensor reduce_scatter_sequence(Context& ctx, const Tensor& y, ParallelGroup& group) {
  return SequenceExchange::start_reduce_scatter(ctx, y, group).finish(ctx);
}

// This rank's (B, T/tp, C) of x (B, T, C), copied.
Tensor split_sequence(Context& ctx, const Tensor& x, ParallelGroup& group) {
  const int64_t t = x.size(1) / group.size();
  return ops::clone(ctx, x.narrow(1, group.rank() * t, t));
}

// Records `out`, a new tensor computed from x, whose backward sends back(dout) to x.
using Backward = Tensor (*)(Context&, const Tensor&, ParallelGroup&);
Tensor record(Graph& g, const Tensor& x, Tensor out, const char* name, ParallelGroup& group,
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
Tensor pass(Context&, const Tensor& dout, ParallelGroup&) { return dout; }

}  // namespace

Tensor tensor_parallel_enter(Graph& g, const Tensor& x, ParallelGroup& group, bool sequence) {
  if (sequence) check_sequence(x, 1, "tensor_parallel_enter");
  Tensor out = sequence ? gather_sequence(g.ctx(), x, group) : x;
  if (!g.should_record({&x}, false)) return out;
  // A new handle on the data: later nodes send their (partial) gradients to it.
  out = Graph::track(out.view(out.shape()));
  ParallelGroup* grp = &group;
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

Tensor tensor_parallel_leave(Graph& g, const Tensor& y, ParallelGroup& group, bool sequence) {
  if (sequence) {
    check_sequence(y, group.size(), "tensor_parallel_leave");
    return record(g, y, reduce_scatter_sequence(g.ctx(), y, group), "sequence_parallel_leave",
                  group, gather_sequence);
  }
  const Tensor sum = ops::clone(g.ctx(), y);  // contiguous
  group.all_reduce_sum(g.ctx(), sum);
  return record(g, y, sum, "tensor_parallel_leave", group, pass);
}

Tensor sequence_split(Graph& g, const Tensor& x, ParallelGroup& group) {
  check_sequence(x, group.size(), "sequence_split");
  return record(g, x, split_sequence(g.ctx(), x, group), "sequence_split", group, gather_sequence);
}

Tensor sequence_gather(Graph& g, const Tensor& x, ParallelGroup& group) {
  check_sequence(x, 1, "sequence_gather");
  return record(g, x, gather_sequence(g.ctx(), x, group), "sequence_gather", group, split_sequence);
}

std::unique_ptr<PendingTransfer> ParallelGroup::start_send_recv(Context& ctx,
                                                                      const Tensor& send, int to,
                                                                      const Tensor& recv, int from) {
  send_recv(ctx, send, to, recv, from);
  return std::make_unique<CompletedTransfer>();
}

std::unique_ptr<PendingTransfer> ParallelGroup::start_all_gather(Context& ctx,
                                                                       const Tensor& out,
                                                                       const Tensor& in) {
  all_gather(ctx, out, in);
  return std::make_unique<CompletedTransfer>();
}

std::unique_ptr<PendingTransfer> ParallelGroup::start_reduce_scatter_sum(Context& ctx,
                                                                               const Tensor& out,
                                                                               const Tensor& in) {
  reduce_scatter_sum(ctx, out, in);
  return std::make_unique<CompletedTransfer>();
}

std::unique_ptr<PendingTransfer> ParallelGroup::start_all_reduce_sum(Context& ctx,
                                                                           const Tensor& t) {
  all_reduce_sum(ctx, t);
  return std::make_unique<CompletedTransfer>();
}

SequenceExchange SequenceExchange::start_gather(Context& ctx, const Tensor& x,
                                                ParallelGroup& group) {
  const int tp = group.size();
  const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
  SequenceExchange e;
  e.gather_ = true;
  e.in_ = ops::contiguous(ctx, x);
  e.parts_ = ctx.empty(Shape{tp, b, t, c}, x.dtype());  // rank-major
  e.pending_ = group.start_all_gather(ctx, e.parts_.flatten(), e.in_.flatten());
  return e;
}

SequenceExchange SequenceExchange::start_reduce_scatter(Context& ctx, const Tensor& y,
                                                        ParallelGroup& group) {
  const int tp = group.size();
  const int64_t b = y.size(0), t = y.size(1) / tp, c = y.size(2);
  SequenceExchange e;
  e.parts_ = ctx.empty(Shape{tp, b, t, c}, y.dtype());  // rank-major
  ops::copy(ctx, e.parts_, ops::contiguous(ctx, y).view(Shape{b, tp, t, c}).permute({1, 0, 2, 3}));
  e.out_ = ctx.empty(Shape{b, t, c}, y.dtype());
  e.pending_ = group.start_reduce_scatter_sum(ctx, e.out_.flatten(), e.parts_.flatten());
  return e;
}

Tensor SequenceExchange::finish(Context& ctx) {
  FSDP_CHECK(pending_, ValueError, "SequenceExchange::finish: not started, or finished already");
  pending_->finish(ctx);
  pending_.reset();
  if (!gather_) return out_;
  const int64_t tp = parts_.size(0), b = parts_.size(1), t = parts_.size(2), c = parts_.size(3);
  const Tensor out = ctx.empty(Shape{b, tp * t, c}, parts_.dtype());
  ops::copy(ctx, out.view(Shape{b, tp, t, c}), parts_.permute({1, 0, 2, 3}));
  return out;
}

std::optional<ColumnInputGrad> ColumnInputGrad::compute(Graph& g, const autograd::GradTarget& x,
                                                        const ColumnParallelInput& column,
                                                        const Shape& x_shape, int64_t in_features,
                                                        DType dtype, const Product& product) {
  const int64_t n = x_shape.numel() / in_features;
  if (!column.group) {
    const autograd::GradSink sink = g.grad_sink(x);
    if (sink.defined()) product(sink.buffer.view(Shape{n, in_features}), sink.accumulate ? 1.0 : 0.0);
    return std::nullopt;
  }
  if (!x.defined()) return std::nullopt;
  const Tensor part = g.ctx().empty(x_shape, dtype);  // (..., in)
  product(part.view(Shape{n, in_features}), 0.0);
  return start(g.ctx(), part, column);
}

ColumnInputGrad ColumnInputGrad::start(Context& ctx, const Tensor& dx,
                                       const ColumnParallelInput& column) {
  ColumnInputGrad d;
  d.dx_ = dx;
  if (column.sequence)
    d.sequence_ = SequenceExchange::start_reduce_scatter(ctx, d.dx_, *column.group);
  else
    d.pending_ = column.group->start_all_reduce_sum(ctx, d.dx_);
  return d;
}

Tensor ColumnInputGrad::finish(Context& ctx) {
  if (sequence_) return sequence_->finish(ctx);
  FSDP_CHECK(pending_, ValueError, "ColumnInputGrad::finish: finished already");
  pending_->finish(ctx);
  pending_.reset();
  return dx_;
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
