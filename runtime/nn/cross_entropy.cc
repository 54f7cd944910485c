// The fused softmax cross-entropy loss.
#include <algorithm>

#include "kernels/ops.h"
#include "runtime/nn/functional.h"
#include "runtime/nn/op_support.h"

namespace fsdp::nn {
Tensor cross_entropy(Graph& g, const Tensor& logits, const Tensor& targets, int64_t vocab_size,
                     int64_t n_valid) {
  Context& ctx = g.ctx();
  FSDP_CHECK(logits.dim() >= 2, ShapeError, "cross_entropy: logits ", logits.str(),
             " must be (..., Vp)");
  const int64_t vp = logits.size(-1);
  FSDP_CHECK(vocab_size > 0 && vocab_size <= vp, ShapeError, "cross_entropy: vocabulary of ",
             vocab_size, " does not fit logits ", logits.str());
  FSDP_CHECK(targets.dtype() == DType::i32 && targets.numel() * vp == logits.numel(), ShapeError,
             "cross_entropy: targets ", targets.str(), " do not match logits ", logits.str(),
             " (one i32 target per row)");
  const Tensor logits2 = detail::rows(ctx, logits, vp);  // (N, Vp)
  const int64_t n = logits2.size(0);
  const Tensor tgt = ops::contiguous(ctx, targets).view(Shape{n});  // (N)
  if (n_valid < 0) n_valid = detail::count_valid_targets(ctx, tgt);
  FSDP_CHECK(n_valid <= n, ValueError, "cross_entropy: ", n_valid, " valid targets among ", n,
             " rows");
  const DType sd = stat_dtype(logits.dtype());
  const Tensor losses = ctx.empty(Shape{n}, sd);  // (N), 0 for ignored rows
  const Tensor lse = ctx.empty(Shape{n}, sd);     // (N)
  ops::cross_entropy_forward(ctx, losses, lse, logits2, tgt, vocab_size);
  // The mean over valid targets (0 when every target is ignored).
  const double inv_valid = 1.0 / double(std::max<int64_t>(n_valid, 1));
  Tensor loss = ops::sum(ctx, losses);  // one element
  ops::scale(ctx, loss, loss, inv_valid);
  if (!g.should_record({&logits}, false)) return loss;

  loss = Graph::track(loss);
  g.record("cross_entropy", {loss.autograd_meta()},
           [tl = Graph::target(logits), logits2, lse, tgt, lm = loss.autograd_meta(), vocab_size,
            inv_valid](Graph& g) {
             if (!Graph::grad_of(lm).defined()) return;
             Context& ctx = g.ctx();
             const double dloss = g.scalar_grad_of(lm) * inv_valid;  // d loss / d per-row loss
             AutogradMeta* meta = tl.meta.get();
             if (!meta) return;
             if (!meta->is_leaf && !meta->grad.defined() && logits2.is_contiguous()) {
               // In place: the logits become their own gradient.
               ops::cross_entropy_backward(ctx, logits2, logits2, lse, tgt, vocab_size, dloss);
               meta->grad = logits2.view(tl.shape);
               meta->grad_owned = true;
               return;
             }
             detail::overwrite_grad(g, tl, [&](const Tensor& dlogits) {
               ops::cross_entropy_backward(ctx, dlogits.view(logits2.shape()), logits2, lse, tgt,
                                           vocab_size, dloss);
             });
           });
  return loss;
}

}  // namespace fsdp::nn
