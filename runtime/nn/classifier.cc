// The language-model head and its loss as one op, chunked over the rows (tokens), so that
// the (N, Vp) logits are never held at once (nn::classifier_loss in functional.h).
//
// Per chunk of rows: logits_c = x_c W^T into one reused buffer, then one kernel computes each
// row's loss and overwrites the row with d loss / d logits; from that gradient dx_c and the
// chunk's share of dW follow at once, and the buffer moves on to the next chunk. The gradient
// is computed in the forward for an upstream gradient of 1; it is linear in that gradient,
// so backward only scales what the forward kept (dx and dW) and hands it on.
//
// A head marked for FP8 (Parameter::fp8, mixed_precision.fp8_classifier) runs the chunk's
// three products in FP8 as a linear layer does (runtime/nn/fp8_linear.h): x_c and W
// quantized for the logits (x_c's transposed copy kept for dW), d loss / d logits quantized
// once for dx_c and dW; the loss itself reads bf16 logits, as in bf16.
#include <algorithm>

#include "kernels/ops.h"
#include "runtime/nn/dense_product.h"
#include "runtime/nn/fp8_linear.h"
#include "runtime/nn/functional.h"
#include "runtime/nn/op_support.h"
#include "runtime/nn/tensor_parallel.h"

namespace fsdp::nn {
// (Over 80 lines on purpose: an op's forward and the backward closure it records are one
// function, so the tensors the forward saves and the backward reads stay in one view.)
Tensor classifier_loss(Graph& g, const Tensor& x, Parameter& weight, const Tensor& targets,
                       int64_t vocab_size, int64_t n_valid, int64_t chunk_rows) {
  Context& ctx = g.ctx();
  const Tensor& w = weight.checked_data();  // (Vp, C)
  FSDP_CHECK(w.dim() == 2, ShapeError, "classifier_loss: weight ", weight.name(), " ", w.str(),
             " must be (Vp, C)");
  const int64_t vp = w.size(0), c = w.size(1);
  FSDP_CHECK(x.dim() >= 1 && x.size(-1) == c, ShapeError, "classifier_loss: input x ", x.str(),
             " does not end in the ", c, " features of weight ", weight.name(), " ", w.str());
  detail::check_compute_dtype(x, weight, "classifier_loss");
  // A vocabulary-parallel head holds rows [begin, begin + Vp) of the full (Vp_full, C) one.
  ParallelGroup* group = weight.placement().vocabulary_group;
  const ops::VocabShard shard = group ? vocab_shard(weight) : ops::VocabShard{0, vp};
  FSDP_CHECK(vocab_size > 0 && vocab_size <= shard.total, ShapeError, "classifier_loss: "
             "vocab_size ", vocab_size, " must lie in [1, ", shard.total, "] for weight ",
             weight.name(), " ", w.str());
  FSDP_CHECK(targets.dtype() == DType::i32 && targets.numel() * c == x.numel(), ShapeError,
             "classifier_loss: targets ", targets.str(), " do not match x ", x.str(),
             " (one i32 target per row)");
  FSDP_CHECK(chunk_rows >= 0, ValueError, "classifier_loss: chunk_rows must be >= 0 (0 = one "
             "chunk), got ", chunk_rows);
  const Tensor x2 = detail::rows(ctx, x, c);  // (N, C)
  const int64_t n = x2.size(0);
  const Tensor tgt = ops::contiguous(ctx, targets).view(Shape{n});  // (N)
  if (n_valid < 0) n_valid = detail::count_valid_targets(ctx, tgt);
  FSDP_CHECK(n_valid <= n, ValueError, "classifier_loss: n_valid = ", n_valid,
             " valid targets among ", n, " rows");
  // The mean over valid targets (0 when every target is ignored): each row's loss enters
  // with weight 1/n_valid, which is the scale of the gradient computed below.
  const double inv_valid = 1.0 / double(std::max<int64_t>(n_valid, 1));
  const bool record = g.should_record({&x}, true);
  const bool want_dx = record && Graph::tracked(x);

  const DType sd = stat_dtype(w.dtype());
  const Tensor losses = ctx.empty(Shape{n}, sd);  // (N), 0 for ignored rows
  // Kept from forward to backward when recording:
  //   dx (N, C) in x's dtype: as large as x itself;
  //   dW (Vp, C) in f32 (f64 for f64 weights), so that summing the chunks' contributions
  //   rounds nothing to bf16: 4 Vp C bytes (154 MB at GPT-2 124M, 412 MB at C = 2048), in
  //   place of the 2 N Vp bytes of bf16 logits the unchunked path keeps.
  const Tensor dx = want_dx ? ctx.empty(Shape{n, c}, x.dtype()) : Tensor();
  const Tensor dw = record ? ctx.empty(Shape{vp, c}, sd) : Tensor();
  const int64_t chunk = chunk_rows == 0 ? n : std::min(chunk_rows, n);
  // One logits buffer for every chunk (chunk, Vp), freed when the forward returns.
  const Tensor buffer = chunk > 0 ? ctx.empty(Shape{chunk, vp}, w.dtype()) : Tensor();
  // Vocabulary parallelism: each rank's softmax statistics (3, chunk), every rank's (P, 3,
  // chunk), and the rows' log-sum-exp (chunk).
  const int64_t shards = group ? group->size() : 0;
  const Tensor partials = group && chunk > 0 ? ctx.empty(Shape{3 * chunk}, sd) : Tensor();
  const Tensor gathered = group && chunk > 0 ? ctx.empty(Shape{shards * 3 * chunk}, sd) : Tensor();
  const Tensor lse = group && chunk > 0 ? ctx.empty(Shape{chunk}, sd) : Tensor();
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t m = std::min(chunk, n - start);
    const Tensor xc = x2.narrow(0, start, m);      // (m, C)
    const Tensor lg = buffer.narrow(0, 0, m);      // (m, Vp)
    const Tensor tc = tgt.narrow(0, start, m);     // (m)
    // FP8 where the head is marked and the chunk's sizes fit (not under vocabulary
    // parallelism, which the plan leaves in bf16).
    const bool chunk_fp8 = !group && fp8::applies(weight, m);
    // logits = x_c W^T; in FP8 with x_c's transposed FP8 copy (C, m) for dW
    const ops::Fp8Matrix x_columns = detail::product(ctx, lg, xc, weight, chunk_fp8, Tensor(),
                                                     ops::Epilogue::None, Tensor(), record);
    if (group) {
      // The rows' losses from every rank's statistics (one all-gather), then this rank's
      // columns of d loss / d logits. x's gradient below is this rank's part of it: the
      // plan sums it over the group where x enters (tensor_parallel_enter).
      const Tensor part = partials.narrow(0, 0, 3 * m).view(Shape{3, m});
      const Tensor all = gathered.narrow(0, 0, shards * 3 * m);
      ops::cross_entropy_shard_stats(ctx, part, lg, tc, vocab_size, shard.begin);
      group->all_gather(ctx, all, part.view(Shape{3 * m}));
      const Tensor lse_c = lse.narrow(0, 0, m);
      ops::cross_entropy_merge_shards(ctx, losses.narrow(0, start, m), lse_c,
                                      all.view(Shape{shards, 3, m}), tc);
      if (record)
        ops::cross_entropy_shard_backward(ctx, lg, lg, lse_c, tc, vocab_size, shard.begin,
                                          inv_valid);
    } else {
      // The row's loss, and with `record` the logits replaced by d loss / d logits.
      ops::cross_entropy_forward_backward(ctx, losses.narrow(0, start, m), lg, tc, vocab_size,
                                          inv_valid, record);
    }
    if (!record) continue;
    std::optional<ops::Fp8Quantized> q;  // dlogits_c quantized once for both products
    if (chunk_fp8) q = fp8::quantize_output_grad(ctx, lg, weight, nullptr);
    if (want_dx)  // dx_c (m, C) = dlogits_c (m, Vp) @ W (Vp, C)
      detail::input_product(ctx, dx.narrow(0, start, m), lg, q, weight, 0.0);
    // dW (Vp, C) (+)= dlogits_c^T (Vp, m) @ x_c (m, C); the first chunk overwrites. Into the
    // forward's own f32 buffer, not the parameter's gradient (see above).
    const double beta = start == 0 ? 0.0 : 1.0;
    if (q)
      fp8::weight_grad_into(ctx, dw, *q, x_columns, beta);
    else
      ops::matmul(ctx, dw, lg, xc, true, false, 1.0, beta);
  }
  if (record && n == 0) ops::fill(ctx, dw, 0.0);
  Tensor loss = ops::sum(ctx, losses);  // one element
  ops::scale(ctx, loss, loss, inv_valid);
  if (!record) return loss;

  loss = Graph::track(loss);
  Parameter* wp = &weight;
  g.record("classifier_loss:" + weight.name(), {loss.autograd_meta()},
           [tx = Graph::target(x), dx, dw, lm = loss.autograd_meta(), wp](Graph& g) {
             if (!Graph::grad_of(lm).defined()) return;
             Context& ctx = g.ctx();
             // The forward's gradients are those of an upstream gradient of 1.
             const double s = g.scalar_grad_of(lm);
             if (dx.defined() && tx.defined()) {
               const Tensor d = dx.view(tx.shape);
               if (s != 1.0) ops::scale(ctx, d, d, s);
               g.accumulate(tx, d);  // adopted without a copy when it is x's first gradient
             }
             // Read W's gradient buffer now, not in forward: FSDP installs it before the
             // unit's backward (a tied head also receives the embedding's gradient there).
             ops::axpby(ctx, wp->grad_for_accumulation(ctx), s, dw, 1.0);
           });
  return loss;
}

}  // namespace fsdp::nn
