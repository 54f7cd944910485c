// Mixture-of-experts routing, row grouping and expert matmuls at the Tensor level
// (kernels/ops.h has the conventions): kernels/moe.cc routes them to kernels/cpu/moe.h or
// kernels/cuda/moe.h, the experts' matmuls to cuBLAS's grouped GEMM
// (kernels/cuda/grouped_matmul.h) or one matmul per expert.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/nn_shapes.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp::ops {

// Shapes: N tokens, E experts, k experts per token (top-k), C channels, R = N k rows sent
// to experts. Scores, weights and their gradients are f32 (f64 beside f64 logits or rows);
// expert indices and row maps are i32.
using RouterScore = kernels::RouterScore;
struct RouterOptions {
  RouterScore score = RouterScore::Softmax;
  int64_t top_k = 2;
  // Divide the k chosen weights by their sum (+ 1e-20): Mixtral, Qwen3-MoE, DeepSeek-V3;
  // OLMoE does not.
  bool normalize = true;
};
// Top-k routing of logits (N, E) (compute dtype): scores (N, E) = softmax over the row or
// sigmoid per expert, saved for the backward and the load-balancing loss; indices (N, k)
// the chosen experts in descending order of float(score) + expert_bias (ties: the lower
// expert first, on every backend); weights (N, k) the chosen unbiased scores, normalized
// when asked. expert_bias (E) f32 (optional) only changes which experts are chosen
// (DeepSeek-V3's auxiliary-loss-free balancing).
void moe_router_forward(Context& ctx, const Tensor& indices, const Tensor& weights,
                        const Tensor& scores, const Tensor& logits, const RouterOptions& options,
                        const Tensor& expert_bias = Tensor());
// dlogits (N, E) (overwritten) from dweights (N, k) through the normalization and the score
// function, plus dscores (N, E) when given (a loss computed from the scores directly, such as
// the load-balancing loss). The choice of experts itself has no gradient.
void moe_router_backward(Context& ctx, const Tensor& dlogits, const Tensor& dweights,
                         const Tensor& scores, const Tensor& indices, const RouterOptions& options,
                         const Tensor& dscores = Tensor());

// The load-balancing loss of a routing (scores (N, E) and indices (N, k) of
// moe_router_forward): the N tokens are `groups` equal runs (the sequences of seq_aux_loss;
// 1 for aux_loss), and the loss is the mean over the runs of E sum_e f_e P_e, with f_e the
// run's share of choices that went to e and P_e its mean score of e (sigmoid scores
// normalized per token first): 1 when balanced. per_token (N) of the scores' dtype: each
// token's term (the loss is their sum); dscores (N, E): coeff times the loss's gradient (the
// router backward's dscores). Both overwritten.
// With run_counts (groups, E) i32 given: the runs are whole runs of run_tokens tokens, of
// which these N / groups each are a part (context parallelism splits every sequence over
// ranks), and run_counts their choices by expert summed over every part
// (moe_group_expert_counts, then a sum over the ranks): f_e and P_e are the whole runs',
// and per_token and dscores this rank's tokens' terms of the whole loss.
void moe_balancing_loss(Context& ctx, const Tensor& per_token, const Tensor& dscores,
                        const Tensor& scores, const Tensor& indices, int64_t groups,
                        bool sigmoid, double coeff, const Tensor& run_counts = Tensor(),
                        int64_t run_tokens = 0);
// counts (groups, E) i32 = the choices of indices (N, k) in each of `groups` equal runs of
// tokens, by expert.
void moe_group_expert_counts(Context& ctx, const Tensor& counts, const Tensor& indices,
                             int64_t groups);
// The router z-loss, the mean over tokens of logsumexp(logits[n])^2: per_token (N) f32
// (f64 for f64 logits) each token's term; dlogits (N, E) of the logits' dtype = coeff times
// its gradient. Both overwritten.
void moe_z_loss(Context& ctx, const Tensor& per_token, const Tensor& dlogits,
                const Tensor& logits, double coeff);

// Groups the (token, slot) pairs of indices (N, k) by expert, stably (within an expert in
// increasing token, then slot), the same on every backend: counts (E) i32 the pairs of each
// expert (its token count), source (R) i32 the token of each sorted row, dest (N, k) i32 the
// sorted row of each pair (source[dest[n, j]] == n). E = counts.size(0).
void moe_sort_by_expert(Context& ctx, const Tensor& counts, const Tensor& source,
                        const Tensor& dest, const Tensor& indices);
// x_sorted (R, C) = x (N, C) rows gathered by source (R).
void moe_permute(Context& ctx, const Tensor& x_sorted, const Tensor& x, const Tensor& source);
// dx (N, C) (+= when accumulate_dx) = the sum over the token's k rows of dx_sorted (R, C),
// gathered through dest (N, k) (deterministic, no atomics).
void moe_permute_backward(Context& ctx, const Tensor& dx, const Tensor& dx_sorted,
                          const Tensor& dest, bool accumulate_dx);
// The combine: out (N, C) = sum over j of weights[n, j] * y_sorted[dest[n, j]], summed in
// f32 (double on the CPU) and rounded once. y_sorted (R, C) and out of the compute dtype.
void moe_unpermute(Context& ctx, const Tensor& out, const Tensor& y_sorted,
                   const Tensor& weights, const Tensor& dest);
// dy_sorted (R, C): row dest[n, j] = weights[n, j] * dout[n]; dweights (N, k) = the dot
// products <dout[n], y_sorted[dest[n, j]]> in f32 (double on the CPU). Both overwritten.
void moe_unpermute_backward(Context& ctx, const Tensor& dy_sorted, const Tensor& dweights,
                            const Tensor& dout, const Tensor& y_sorted, const Tensor& weights,
                            const Tensor& dest);

// How CUDA runs the experts' matmuls: Auto = the experts with few rows (at most 1536) in
// one cuBLAS grouped GEMM (their tiles in one launch) where cuBLAS has one for the dtypes,
// and one cuBLASLt matmul for each other expert with rows; PerExpert = one cuBLASLt matmul
// per expert with rows. The CPU runs one per expert.
enum class GroupedMatmulMethod : uint8_t { Auto, PerExpert };

// Expert e's linear layer on its rows: x (R, K) holds the experts' rows one after the other,
// counts[e] of them for expert e (the host copy of moe_sort_by_expert's counts); w (E, F, K)
// a Linear weight per expert. y (R, F): y_e = x_e @ w_e^T.
void moe_grouped_matmul(Context& ctx, const Tensor& y, const Tensor& x, const Tensor& w,
                        const std::vector<int64_t>& counts,
                        GroupedMatmulMethod method = GroupedMatmulMethod::Auto);
// dx (R, K) = dy_e @ w_e (overwritten; skipped when undefined); dw (E, F, K) (+= when
// accumulate) dy_e^T @ x_e in its grad dtype (skipped when undefined). An expert without
// rows gets a zero gradient (left as it is when accumulating).
void moe_grouped_matmul_backward(Context& ctx, const Tensor& dx, const Tensor& dw,
                                 const Tensor& dy, const Tensor& x, const Tensor& w,
                                 const std::vector<int64_t>& counts, bool accumulate,
                                 GroupedMatmulMethod method = GroupedMatmulMethod::Auto);

}  // namespace fsdp::ops
