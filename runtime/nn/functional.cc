// Dense differentiable ops: linear, embedding, norms, activations, the residual add.
#include "runtime/nn/functional.h"

#include "kernels/ops.h"
#include "runtime/nn/dense_product.h"
#include "runtime/nn/fp8_linear.h"
#include "runtime/nn/op_support.h"
#include "runtime/nn/tensor_parallel.h"

namespace fsdp::nn {

using detail::overwrite_grad;
using detail::rows;
using detail::with_last;

DType stat_dtype(DType compute) { return compute == DType::f64 ? DType::f64 : DType::f32; }

// ---------------------------------------------------------------- linear

Tensor linear(Graph& g, const Tensor& x, Parameter& weight, Parameter* bias,
              ops::Epilogue epilogue, const ColumnParallelInput& column) {
  Context& ctx = g.ctx();
  FSDP_CHECK(!weight.placement().vocabulary_group, ValueError, "linear ", weight.name(),
             ": the weight is vocabulary-parallel (its rows are split over the tensor-parallel "
             "group), so its logits would be a part of the vocabulary; only the loss "
             "(classifier_loss) runs it");
  // (out, in); a weight gathered in FP8 has only its FP8 bytes (fp8::applies).
  FSDP_CHECK(weight.shape().rank() == 2, ShapeError, "linear ", weight.name(), ": the weight ",
             weight.shape(), " is not 2-D");
  const int64_t out_f = weight.shape()[0], in_f = weight.shape()[1];
  FSDP_CHECK(x.dim() >= 1 && x.size(-1) == in_f, ShapeError, "linear ", weight.name(), ": input ",
             x.str(), " does not end in ", in_f, " features");
  detail::check_compute_dtype(x, weight, "linear");
  const detail::ProductInput in = detail::product_input(ctx, x, column, in_f, "linear", weight);
  const bool gathered = in.gathered;
  const Tensor& whole = in.whole;  // (..., in)
  const Tensor& x2 = in.rows;      // (N, in)
  const int64_t n = x2.size(0);
  Tensor y = ctx.empty(with_last(whole.shape(), out_f), x.dtype());  // (..., out)
  const bool gelu = epilogue == ops::Epilogue::Gelu;
  const Tensor pre = gelu ? ctx.empty(Shape{n, out_f}, x.dtype()) : Tensor();  // (N, out)
  // FP8 where the FP8 plan marked the weight (and the sizes fit).
  const bool use_fp8 = fp8::applies(weight, n);
  const bool records = g.should_record({&x}, true);
  // The weight gradient's input: in FP8, its transposed FP8 copy (in, N) from the forward's
  // quantization; under sequence parallelism only this rank's part of the input (gathered
  // again, and quantized again in FP8, in the backward), as the unquantized layer keeps it.
  const ops::Fp8Matrix x_columns =
      detail::product(ctx, y.view(Shape{n, out_f}), x2, weight, use_fp8,
                      bias ? bias->checked_data() : Tensor(), epilogue, pre, records && !gathered);
  if (!records) return y;

  y = Graph::track(y);
  Parameter* wp = &weight;
  const Tensor saved = gathered ? ops::contiguous(ctx, x) : use_fp8 ? Tensor() : x2;
  g.record("linear:" + weight.name(), {y.autograd_meta()},
           [tx = Graph::target(x), saved, pre, ym = y.autograd_meta(), wp, bias, gelu, n, out_f,
            in_f, column, gathered, use_fp8, x_columns, whole_shape = whole.shape()](Graph& g) {
             Tensor dy = Graph::grad_of(ym);
             if (!dy.defined()) return;
             Context& ctx = g.ctx();
             dy = rows(ctx, dy, out_f);  // (N, out)
             if (gelu) {
               Tensor dpre = ctx.empty(Shape{n, out_f}, dy.dtype());  // (N, out)
               ops::gelu_backward(ctx, dpre, dy, pre);
               dy = dpre;
             }
             // Column-parallel under sequence parallelism: the input gathered again while
             // the input gradient is computed.
             std::optional<SequenceExchange> regather;
             if (gathered) regather = SequenceExchange::start_gather(ctx, saved, *column.group);
             // In FP8, dy quantized once for both products; db (out) += its column sums
             // from the same read.
             std::optional<ops::Fp8Quantized> q;
             if (use_fp8) q = fp8::quantize_output_grad(ctx, dy, *wp, bias);
             // dx (N, in) (+)= dy (N, out) @ W (out, in)
             auto input_grad = [&](const Tensor& dx, double beta) {
               detail::input_product(ctx, dx, dy, q, *wp, beta);
             };
             // Column-parallel: this rank's part of dx, summed over the group while the
             // weight gradient is computed.
             std::optional<ColumnInputGrad> dx =
                 ColumnInputGrad::compute(g, tx, column, whole_shape, in_f, dy.dtype(), input_grad);
             // dW (out, in) += dy^T (out, N) @ x (N, in) [db (out) += column sums of dy]
             const Tensor x2 = gathered ? rows(ctx, regather->finish(ctx), in_f) : saved;
             detail::weight_product(ctx, *wp, bias, dy, q, x_columns, x2);
             if (dx) g.accumulate(tx, dx->finish(ctx));
           });
  return y;
}

// ---------------------------------------------------------------- embedding

Tensor embedding(Graph& g, const Tensor& idx, Parameter& wte, Parameter* wpe,
                 std::optional<DType> out_dtype) {
  Context& ctx = g.ctx();
  const Tensor& w = wte.checked_data();  // (V, C)
  FSDP_CHECK(idx.dim() == 2 && idx.dtype() == DType::i32, ShapeError, "embedding ", wte.name(),
             ": indices must be (B, T) i32, got ", idx.str());
  const int64_t b = idx.size(0), t = idx.size(1), c = w.size(1);
  if (wpe) {
    const Tensor& p = wpe->checked_data();  // (T', C)
    FSDP_CHECK(p.size(1) == c && p.dtype() == w.dtype(), ShapeError, "embedding: positions ",
               p.str(), " do not match the token table ", w.str());
    FSDP_CHECK(t <= p.size(0), ShapeError, "embedding: sequence of ", t, " tokens is longer than ",
               wpe->name(), "'s ", p.size(0), " positions");
  }
  const Tensor ids = ops::contiguous(ctx, idx);
  // A vocabulary-parallel table gives each rank's rows (zeros for the ids another rank
  // holds), summed over the group below. The positions are added on the group's rank 0
  // only, so that the sum holds them once; the plan marks wpe's gradient, which only rank 0
  // computes, Placement::partial_grad.
  ParallelGroup* group = wte.placement().vocabulary_group;
  const ops::VocabShard shard = group ? vocab_shard(wte) : ops::VocabShard{};
  if (group && group->rank() != 0) wpe = nullptr;
  // The tokens' positions: [0, T), or under context parallelism this rank's two chunks of
  // the sequence (each piece: its local columns [first, first + n) at positions from `at`).
  struct Piece {
    int64_t first, n, at;
  };
  std::vector<Piece> pieces{{0, t, 0}};
  if (wpe && wpe->placement().sequence_chunks) {
    const ContextParallelLayout& layout = *wpe->placement().sequence_chunks;
    FSDP_CHECK(t == layout.local_seq(), ShapeError, "embedding: ", t, " tokens for ", wpe->name(),
               "'s context-parallel chunks of ", layout.local_seq());
    const int64_t n = layout.chunk();
    pieces = {{0, n, layout.chunk_begin(0)}, {n, n, layout.chunk_begin(1)}};
  }
  // Each piece's ids (contiguous, as the kernels read them).
  std::vector<Tensor> piece_ids;
  for (const Piece& p : pieces)
    piece_ids.push_back(pieces.size() == 1 ? ids : ops::contiguous(ctx, ids.narrow(1, p.first, p.n)));
  Tensor out = ctx.empty(Shape{b, t, c}, out_dtype.value_or(w.dtype()));  // (B, T, C)
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    const Tensor positions = wpe ? wpe->data.narrow(0, p.at, p.n) : Tensor();
    if (pieces.size() == 1) {
      ops::embedding_forward(ctx, out, ids, w, positions, shard);
      break;
    }
    const Tensor part = ctx.empty(Shape{b, p.n, c}, out.dtype());
    ops::embedding_forward(ctx, part, piece_ids[i], w, positions, shard);
    ops::copy(ctx, out.narrow(1, p.first, p.n), part);
  }
  if (g.should_record({}, true)) {
    out = Graph::track(out);
    Parameter* wtep = &wte;
    g.record("embedding:" + wte.name(), {out.autograd_meta()},
             [piece_ids, pieces, om = out.autograd_meta(), wtep, wpe, shard](Graph& g) {
               Tensor dout = Graph::grad_of(om);
               if (!dout.defined()) return;
               Context& ctx = g.ctx();
               for (size_t i = 0; i < pieces.size(); ++i) {
                 const Piece& p = pieces[i];
                 const Tensor dpos = wpe ? wpe->grad_for_accumulation(ctx).narrow(0, p.at, p.n) : Tensor();
                 const Tensor d = pieces.size() == 1 ? dout : dout.narrow(1, p.first, p.n);
                 ops::embedding_backward(ctx, wtep->grad_for_accumulation(ctx), dpos,
                                         ops::contiguous(ctx, d), piece_ids[i], shard);
               }
             });
  }
  return group ? tensor_parallel_leave(g, out, *group, wte.placement().scatter_sequence) : out;
}

// ---------------------------------------------------------------- norms

namespace {

// Checks x (..., C) against a norm's weight; returns C.
int64_t check_norm_input(const Tensor& x, Parameter& weight, const char* op) {
  const int64_t c = weight.checked_data().numel();
  FSDP_CHECK(x.dim() >= 1 && x.size(-1) == c, ShapeError, op, " ", weight.name(), ": input ",
             x.str(), " does not end in ", c, " channels");
  detail::check_stream_dtype(x, weight, op);
  return c;
}

// Records the backward of out = norm(x) (bias null for RMSNorm, mean undefined): dx is
// written where x's gradient lives, added to a gradient x already holds.
Tensor record_norm(Graph& g, const Tensor& x, const Tensor& x2, Tensor out, const Tensor& mean,
                   const Tensor& rstd, Parameter& weight, Parameter* bias) {
  out = Graph::track(out);
  const int64_t n = x2.size(0), c = x2.size(1);
  Parameter* wp = &weight;
  g.record((bias ? "layer_norm:" : "rms_norm:") + weight.name(), {out.autograd_meta()},
           [tx = Graph::target(x), x2, mean, rstd, om = out.autograd_meta(), wp, bias, n,
            c](Graph& g) {
             Tensor dout = Graph::grad_of(om);
             if (!dout.defined()) return;
             Context& ctx = g.ctx();
             // The kernel writes dx and the parameter gradients together; an input that takes
             // no gradient gets a scratch buffer.
             const autograd::GradSink sx = g.grad_sink_or_addend(tx);
             const Tensor dx = sx.defined() ? sx.buffer.view(Shape{n, c})
                                            : ctx.empty(Shape{n, c}, tx.dtype);
             const Tensor addend = sx.addend.defined() ? sx.addend.view(Shape{n, c}) : Tensor();
             if (bias)
               ops::layernorm_backward(ctx, dx, wp->grad_for_accumulation(ctx),
                                       bias->grad_for_accumulation(ctx), rows(ctx, dout, c), x2,
                                       wp->checked_data(), mean, rstd, sx.accumulate, true,
                                       addend);
             else
               ops::rmsnorm_backward(ctx, dx, wp->grad_for_accumulation(ctx), rows(ctx, dout, c),
                                     x2, wp->checked_data(), rstd, sx.accumulate, true, addend);
           });
  return out;
}

// Records the backward of out = a + b: both inputs take out's gradient.
Tensor record_add(Graph& g, Tensor out, const Tensor& a, const Tensor& b) {
  out = Graph::track(out);
  g.record("add", {out.autograd_meta()}, [ta = Graph::target(a), tb = Graph::target(b), om = out.autograd_meta()](Graph& g) {
    const Tensor dout = Graph::grad_of(om);
    if (!dout.defined()) return;
    // Both inputs adopt the same gradient tensor; Graph copies it before anyone adds to it.
    // A narrower b (a bf16 branch of an f32 stream) takes it rounded to its own dtype.
    g.accumulate(ta, dout);
    if (tb.meta) g.accumulate(tb, tb.dtype == dout.dtype() ? dout : ops::cast(g.ctx(), dout, tb.dtype));
  });
  return out;
}

// The statistics of a norm over x2 (N, C): mean (LayerNorm only) and rstd.
Tensor stats(Context& ctx, const Parameter& weight, int64_t n) {
  return ctx.empty(Shape{n}, stat_dtype(weight.data.dtype()));  // (N)
}

}  // namespace

Tensor layer_norm(Graph& g, const Tensor& x, Parameter& weight, Parameter& bias, double eps) {
  Context& ctx = g.ctx();
  const int64_t c = check_norm_input(x, weight, "layer_norm");
  const Tensor x2 = rows(ctx, x, c);  // (N, C)
  const int64_t n = x2.size(0);
  const Tensor out = ctx.empty(x.shape(), weight.data.dtype());
  const Tensor mean = stats(ctx, weight, n), rstd = stats(ctx, weight, n);
  ops::layernorm_forward(ctx, out.view(Shape{n, c}), mean, rstd, x2, weight.data,
                         bias.checked_data(), eps);
  if (!g.should_record({&x}, true)) return out;
  return record_norm(g, x, x2, out, mean, rstd, weight, &bias);
}

Tensor rms_norm(Graph& g, const Tensor& x, Parameter& weight, double eps) {
  Context& ctx = g.ctx();
  const int64_t c = check_norm_input(x, weight, "rms_norm");
  const Tensor x2 = rows(ctx, x, c);  // (N, C)
  const int64_t n = x2.size(0);
  const Tensor out = ctx.empty(x.shape(), weight.data.dtype());
  const Tensor rstd = stats(ctx, weight, n);
  ops::rmsnorm_forward(ctx, out.view(Shape{n, c}), rstd, x2, weight.data, eps);
  if (!g.should_record({&x}, true)) return out;
  return record_norm(g, x, x2, out, Tensor(), rstd, weight, nullptr);
}

namespace {

// x + residual and its norm (bias null: RMSNorm) in one forward kernel; the backward is the
// add's and the norm's nodes.
AddNorm add_norm(Graph& g, const Tensor& x, const Tensor& residual, Parameter& weight,
                 Parameter* bias, double eps, const char* op) {
  Context& ctx = g.ctx();
  check_same_shape(x, residual, op);
  const int64_t c = check_norm_input(x, weight, op);
  const Tensor x2 = rows(ctx, x, c), r2 = rows(ctx, residual, c);  // (N, C)
  const int64_t n = x2.size(0);
  const Tensor sum = ctx.empty(x.shape(), x.dtype());
  const Tensor out = ctx.empty(x.shape(), weight.data.dtype());
  const Tensor mean = bias ? stats(ctx, weight, n) : Tensor(), rstd = stats(ctx, weight, n);
  const Tensor sum2 = sum.view(Shape{n, c}), out2 = out.view(Shape{n, c});
  if (bias)
    ops::add_layernorm_forward(ctx, sum2, out2, mean, rstd, x2, r2, weight.data,
                               bias->checked_data(), eps);
  else
    ops::add_rmsnorm_forward(ctx, sum2, out2, rstd, x2, r2, weight.data, eps);
  if (!g.should_record({&x, &residual}, true)) return {sum, out};
  // The same two nodes as add() then the norm: only the forward is fused.
  const Tensor tracked = g.should_record({&x, &residual}, false) ? record_add(g, sum, x, residual)
                                                                 : sum;
  return {tracked, record_norm(g, tracked, tracked.view(Shape{n, c}), out, mean, rstd, weight,
                               bias)};
}

}  // namespace

AddNorm add_layer_norm(Graph& g, const Tensor& x, const Tensor& residual, Parameter& weight,
                       Parameter& bias, double eps) {
  return add_norm(g, x, residual, weight, &bias, eps, "add_layer_norm");
}

AddNorm add_rms_norm(Graph& g, const Tensor& x, const Tensor& residual, Parameter& weight,
                     double eps) {
  return add_norm(g, x, residual, weight, nullptr, eps, "add_rms_norm");
}

// ---------------------------------------------------------------- activations

Tensor gelu(Graph& g, const Tensor& x) {
  Context& ctx = g.ctx();
  const Tensor xc = ops::contiguous(ctx, x);
  Tensor out = ctx.empty(x.shape(), x.dtype());
  ops::gelu_forward(ctx, out, xc);
  if (!g.should_record({&x}, false)) return out;

  out = Graph::track(out);
  g.record("gelu", {out.autograd_meta()}, [tx = Graph::target(x), xc, om = out.autograd_meta()](Graph& g) {
    Tensor dout = Graph::grad_of(om);
    if (!dout.defined()) return;
    Context& ctx = g.ctx();
    dout = ops::contiguous(ctx, dout);
    overwrite_grad(g, tx, [&](const Tensor& dx) { ops::gelu_backward(ctx, dx, dout, xc); });
  });
  return out;
}

Tensor swiglu(Graph& g, const Tensor& x) {
  Context& ctx = g.ctx();
  FSDP_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, ShapeError, "swiglu: input ", x.str(),
             " must end in an even number (2F) of features");
  const int64_t f = x.size(-1) / 2;
  const Tensor x2 = rows(ctx, x, 2 * f);  // (N, 2F)
  const int64_t n = x2.size(0);
  Tensor out = ctx.empty(with_last(x.shape(), f), x.dtype());  // (..., F)
  ops::swiglu_forward(ctx, out.view(Shape{n, f}), x2);
  if (!g.should_record({&x}, false)) return out;

  out = Graph::track(out);
  g.record("swiglu", {out.autograd_meta()}, [tx = Graph::target(x), x2, om = out.autograd_meta(), n, f](Graph& g) {
    Tensor dout = Graph::grad_of(om);
    if (!dout.defined()) return;
    Context& ctx = g.ctx();
    const Tensor dout2 = rows(ctx, dout, f);  // (N, F)
    overwrite_grad(g, tx, [&](const Tensor& dx) {
      ops::swiglu_backward(ctx, dx.view(Shape{n, 2 * f}), dout2, x2);
    });
  });
  return out;
}

// ---------------------------------------------------------------- residual add

Tensor add(Graph& g, const Tensor& a, const Tensor& b) {
  Context& ctx = g.ctx();
  check_same_shape(a, b, "add");
  Tensor out = ctx.empty(a.shape(), a.dtype());
  ops::add(ctx, out, a, b);
  if (!g.should_record({&a, &b}, false)) return out;
  return record_add(g, out, a, b);
}

}  // namespace fsdp::nn
