// The fused cross-entropy at the Tensor level (kernels/ops.h has the conventions):
// kernels/cross_entropy.cc routes it to kernels/cpu/cross_entropy.h or
// kernels/cuda/cross_entropy.h.
#pragma once

#include <cstdint>

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp::ops {

// logits (N, Vp), targets (N) i32 in [0, V) or -1 (ignored); the padded columns [V, Vp) are
// excluded from the softmax. losses (N) and lse (N) f32: per-row loss (0 for ignored rows)
// and log-sum-exp.
void cross_entropy_forward(Context& ctx, const Tensor& losses, const Tensor& lse,
                           const Tensor& logits, const Tensor& targets, int64_t vocab_size);
// dlogits (N, Vp) = (softmax(logits) - onehot(target)) * dloss, with 0 in the padded
// columns and for ignored rows. dlogits may be the logits tensor itself (in place: the
// probabilities are never stored separately). dloss is a scalar (every row's weight).
void cross_entropy_backward(Context& ctx, const Tensor& dlogits, const Tensor& logits,
                            const Tensor& lse, const Tensor& targets, int64_t vocab_size,
                            double dloss);
// Forward and backward in one kernel, in place (the chunked classifier): losses (N) f32 as
// cross_entropy_forward and, when write_grad, the logits (N, Vp) overwritten with their
// gradient (softmax - onehot) * dloss (0 in the padded columns and ignored rows); without
// write_grad the logits are only read. No log-sum-exp is kept: nothing runs afterwards.
void cross_entropy_forward_backward(Context& ctx, const Tensor& losses, const Tensor& logits,
                                    const Tensor& targets, int64_t vocab_size, double dloss,
                                    bool write_grad);

// Vocabulary parallelism: each tensor-parallel rank holds logits (N, Vl) for the classes
// [vocab_begin, vocab_begin + Vl) of a vocabulary of vocab_size (classes at or past
// vocab_size are padding), and the row's softmax is merged from every rank's statistics:
//   shard_stats: partials (3, N) = this shard's max m, sum of exp(x - m) (-inf and 0 when it
//                holds no class), and the target's logit when it holds the target (else 0);
//   merge_shards: every rank's partials (P, 3, N) in rank order -> losses (N) and lse (N),
//                 the same bits on every rank;
//   shard_backward: cross_entropy_backward for the shard's columns (dlogits may be logits).
// Statistics are f32 (f64 for f64 logits).
void cross_entropy_shard_stats(Context& ctx, const Tensor& partials, const Tensor& logits,
                               const Tensor& targets, int64_t vocab_size, int64_t vocab_begin);
void cross_entropy_merge_shards(Context& ctx, const Tensor& losses, const Tensor& lse,
                                const Tensor& partials, const Tensor& targets);
void cross_entropy_shard_backward(Context& ctx, const Tensor& dlogits, const Tensor& logits,
                                  const Tensor& lse, const Tensor& targets, int64_t vocab_size,
                                  int64_t vocab_begin, double dloss);

}  // namespace fsdp::ops
