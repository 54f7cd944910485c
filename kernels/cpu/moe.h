// CPU mixture-of-experts kernels: top-k routing, the stable grouping of (token, slot) pairs
// by expert, and the gathers that move token rows to and from their experts. Computed in
// double, rounded once when stored. S below is the statistics type: float, or double for
// f64 rows.
#pragma once

#include <cstdint>

#include "kernels/nn_shapes.h"

namespace fsdp::kernels::cpu {

// logits (N, E) -> scores (N, E) S (softmax or sigmoid), indices (N, k) i32 in descending
// order of the key float(score) + bias (ties: the lower expert first), weights (N, k) S from
// the unbiased scores (divided by their sum + 1e-20 when d.normalize). bias (E) f32 or null.
void moe_router_forward(const RouterDims& d, int32_t* indices, void* weights, void* scores,
                        const void* logits, const float* bias);
// dlogits (N, E) from dweights (N, k) S through the normalization and the score function,
// plus dscores (N, E) S (a gradient reaching the scores directly; null: none).
void moe_router_backward(const RouterDims& d, void* dlogits, const void* dweights,
                         const void* dscores, const void* scores, const int32_t* indices);

// counts (groups, E) = the choices of each run of N / groups tokens (indices (N, k)), by
// expert.
void moe_group_expert_counts(const MoeLossDims& d, int32_t* counts, const int32_t* indices);
// The load-balancing loss: for each run of n = N / groups tokens, E sum_e f_e P_e with f_e
// the run's share of choices that went to e and P_e the run's mean (normalized) score of e,
// weighted 1 / groups. per_token (N) S: each token's term (the loss is their sum); dscores
// (N, E) S = coeff times the loss's gradient. Both overwritten. With run_counts (groups, E)
// given, f_e and P_e are those of whole runs of d.run_tokens tokens spread over several
// ranks, whose choices run_counts sums (this rank's tokens then give their terms of it).
void moe_balancing_loss(const MoeLossDims& d, void* per_token, void* dscores, const void* scores,
                        const int32_t* indices, double coeff, const int32_t* run_counts = nullptr);
// The z-loss, the mean over tokens of logsumexp(logits)^2: per_token (N) S = lse^2 / N,
// dlogits (N, E) of d.dtype = coeff times its gradient (2 lse softmax / N). Overwritten.
void moe_z_loss(const MoeLossDims& d, void* per_token, void* dlogits, const void* logits,
                double coeff);

// indices (N, k) in [0, E) (IndexError otherwise) -> counts (E), and the (token, slot) pairs
// sorted stably by expert: source (N k) = the token of each sorted row, dest (N, k) = the
// sorted row of each pair.
void moe_sort_by_expert(int64_t tokens, int64_t top_k, int64_t experts, int32_t* counts,
                        int32_t* source, int32_t* dest, const int32_t* indices);

// x_sorted (N k, C) = x[source[r]].
void moe_permute(const MoeRowsDims& d, void* x_sorted, const void* x, const int32_t* source);
// dx (N, C) (+)= sum over slots j of dx_sorted[dest[n, j]].
void moe_permute_backward(const MoeRowsDims& d, void* dx, const void* dx_sorted,
                          const int32_t* dest, bool accumulate_dx);
// out (N, C) = sum over j of weights[n, j] * y_sorted[dest[n, j]].
void moe_unpermute(const MoeRowsDims& d, void* out, const void* y_sorted, const void* weights,
                   const int32_t* dest);
// dy_sorted[dest[n, j]] = weights[n, j] * dout[n];
// dweights[n, j] = <dout[n], y_sorted[dest[n, j]]>.
void moe_unpermute_backward(const MoeRowsDims& d, void* dy_sorted, void* dweights,
                            const void* dout, const void* y_sorted, const void* weights,
                            const int32_t* dest);

}  // namespace fsdp::kernels::cpu
