// Transformer kernels at the Tensor level: matmul, embeddings, norms, activations, rotary
// embeddings, attention, fused cross-entropy, mixture-of-experts routing and expert
// matmuls, AdamW and the counter-based initializer.
//
// Conventions (shared by the CPU reference in kernels/cpu/ and the CUDA kernels in
// kernels/cuda/):
// - Activations and weights share one compute dtype: f32 or f64 on the CPU, bf16 or f32 on
//   CUDA. bf16 is computed in f32 and rounded once when stored. One exception, on CUDA: the
//   residual stream may be f32 beside bf16 weights (the embedding's output, the norms' x and
//   dx), so the sums that carry the signal through the network are never rounded to bf16.
// - Statistics saved for backward (norm mean/rstd, attention logsumexp, per-token losses)
//   are f32 (f64 when the compute dtype is f64).
// - Parameter gradients are written into tensors of their own "grad dtype" (f32 or f64 on
//   the CPU; bf16 or f32 on CUDA), which may differ from the compute dtype, and are
//   ACCUMULATED (+=) when `accumulate` is true, overwritten otherwise. Activation gradients
//   are written in the compute dtype; `accumulate_dx` adds instead of overwriting where the
//   op's input feeds more than one consumer (the residual stream).
// - Weights follow PyTorch's layout: a Linear weight is (out_features, in_features).
// - Shapes in comments: B batch, T sequence, C channels, H heads, Hkv key/value heads,
//   D head dim, V vocabulary, Vp padded vocabulary, N rows (= B*T), F hidden features.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/nn_shapes.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp::ops {

// ---------------------------------------------------------------- backend options
// Per-context switches of how the ops run, for tests and benchmarks:
//   ctx.extension<ops::KernelOptions>().use_cudnn_attention = false;
struct KernelOptions {
  explicit KernelOptions(Context&) {}
  // CUDA attention through cuDNN's fused kernels where they support the shape and dtype;
  // false forces our own attention kernels everywhere.
  bool use_cudnn_attention = true;
};

// ---------------------------------------------------------------- matmul
// None, Gelu (pre-activation saved in `aux`), DGelu (out = product * gelu'(aux)): see
// kernels/nn_shapes.h.
using Epilogue = kernels::MatmulEpilogue;

// out (M, N) = alpha * op(a) @ op(b) + beta * out [+ bias (N)] [then epilogue].
// op(a) is (M, K): a is (M, K), or (K, M) with trans_a. op(b) is (K, N): b is (K, N), or
// (N, K) with trans_b. All 2-D and row-major contiguous (leading dimension = row length).
// `out` may be a wider dtype than a and b (bf16 inputs, f32 out) for gradient accumulation.
// With Epilogue::Gelu, `aux` (M, N) receives the pre-activation (for gelu_backward); with
// Epilogue::DGelu, aux is that pre-activation and out = (op(a) @ op(b)) * gelu'(aux) (the
// gradient at the GELU's input, fused into the matmul that computes the gradient at its
// output; no bias, beta 0).
void matmul(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a,
            bool trans_b, double alpha = 1.0, double beta = 0.0, const Tensor& bias = Tensor(),
            Epilogue epilogue = Epilogue::None, const Tensor& aux = Tensor());

// Batched: a (Bt, M, K) etc., same rules per batch (used by the reference attention).
void batched_matmul(Context& ctx, const Tensor& out, const Tensor& a, const Tensor& b,
                    bool trans_a, bool trans_b, double alpha = 1.0, double beta = 0.0);

// dbias (N) (+)= sum over rows of dout (M, N).
void bias_backward(Context& ctx, const Tensor& dbias, const Tensor& dout, bool accumulate);

// A linear layer's weight and bias gradients from one read of the output gradient:
// dw (M, N) = alpha * op(a) @ op(b) + beta * dw as matmul, and dbias (M) (+)= the sums over
// K of op(a) (with a = dy (K, M), trans_a: the column sums of dy). On CUDA the bias sums are
// cuBLASLt's BGRADB epilogue of the same matmul where it has one for the problem; otherwise,
// and on the CPU, matmul then bias_backward.
void matmul_bias_grad(Context& ctx, const Tensor& dw, const Tensor& a, const Tensor& b,
                      bool trans_a, bool trans_b, double alpha, double beta, const Tensor& dbias,
                      bool accumulate_dbias);

// ---------------------------------------------------------------- embeddings
// Which ids a token table's rows are: [begin, begin + V) of a vocabulary of `total` ids (a
// vocabulary-parallel shard); total 0: the table is whole.
struct VocabShard {
  int64_t begin = 0, total = 0;
};
// out (B, T, C) = wte[idx] (+ wpe[t] when wpe is defined). idx (B, T) i32, wte (V, C), wpe (T', C).
// out has the tables' dtype, or f32 beside bf16 tables (CUDA). A shard's table gives zero
// rows (plus the positions) for the ids it does not hold.
void embedding_forward(Context& ctx, const Tensor& out, const Tensor& idx, const Tensor& wte,
                       const Tensor& wpe = Tensor(), const VocabShard& shard = {});
// dwte (V, C) += scatter of dout rows by idx (a shard's rows only); dwpe (T', C) += sum over
// B of dout. Always accumulates (a tied embedding also receives the classifier's
// gradient). Deterministic.
void embedding_backward(Context& ctx, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                        const Tensor& idx, const VocabShard& shard = {});

// ---------------------------------------------------------------- norms
// LayerNorm over the last dim: x (N, C), weight/bias (C); out (N, C); mean/rstd (N). out and
// dout have the weight's dtype; x and dx the same, or f32 beside bf16 weights (CUDA).
void layernorm_forward(Context& ctx, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                       const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
// dx (N, C) (+= when accumulate_dx); dweight, dbias (C) (+= when accumulate). With dx_addend
// (x's dtype and shape; accumulate_dx false): dx = dx_addend + the norm's gradient, for a
// gradient that reached x by another path and must not be modified in place.
void layernorm_backward(Context& ctx, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                        const Tensor& dout, const Tensor& x, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, bool accumulate_dx,
                        bool accumulate, const Tensor& dx_addend = Tensor());
// RMSNorm: out = x * rstd * weight; rstd (N).
void rmsnorm_forward(Context& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x,
                     const Tensor& weight, double eps);
void rmsnorm_backward(Context& ctx, const Tensor& dx, const Tensor& dweight, const Tensor& dout,
                      const Tensor& x, const Tensor& weight, const Tensor& rstd,
                      bool accumulate_dx, bool accumulate, const Tensor& dx_addend = Tensor());
// The residual add fused into the norm that follows it: sum = x + residual (x's dtype, as
// ops::add rounds it; residual has the weight's dtype) and out = norm(sum), in one pass.
void add_layernorm_forward(Context& ctx, const Tensor& sum, const Tensor& out, const Tensor& mean,
                           const Tensor& rstd, const Tensor& x, const Tensor& residual,
                           const Tensor& weight, const Tensor& bias, double eps);
void add_rmsnorm_forward(Context& ctx, const Tensor& sum, const Tensor& out, const Tensor& rstd,
                         const Tensor& x, const Tensor& residual, const Tensor& weight,
                         double eps);

// ---------------------------------------------------------------- activations
// GELU, tanh approximation (GPT-2's): out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(Context& ctx, const Tensor& out, const Tensor& x);
void gelu_backward(Context& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x);
// SwiGLU on a fused projection: x (N, 2F) = [gate | up]; out (N, F) = silu(gate) * up.
void swiglu_forward(Context& ctx, const Tensor& out, const Tensor& x);
void swiglu_backward(Context& ctx, const Tensor& dx, const Tensor& dout, const Tensor& x);

// ---------------------------------------------------------------- rotary embeddings
// out = q or k rotated: x (B, T, H, D) (any strides for B, T, H; D contiguous) by angle
// t * theta^(-2i/D) for the pair (i, i + D/2) ("rotate half", as Llama in Hugging Face).
// inverse = true applies the opposite rotation (the backward of the forward rotation).
// Row t is at position position_offset + t (new tokens after a key/value cache's). out has
// x's shape and dtype, any strides with D contiguous, and is x itself or shares no memory
// with it: a strided view of a fused projection rotates into a contiguous tensor in one
// pass.
void rope(Context& ctx, const Tensor& out, const Tensor& x, double theta, bool inverse,
          int64_t position_offset = 0);
// rope in place: x = rope(x).
void rope_apply(Context& ctx, const Tensor& x, double theta, bool inverse,
                int64_t position_offset = 0);

// ---------------------------------------------------------------- attention
// Causal scaled-dot-product attention with grouped-query heads. q (B, T, H, D),
// k and v (B, T, Hkv, D) (H % Hkv == 0), any strides for B, T, H with D contiguous (they
// are usually views into one fused qkv projection); out (B, T, H, D) contiguous;
// lse (B, H, T) f32 holds the softmax's log-sum-exp for the backward. scale = 1/sqrt(D)
// when 0. On CUDA, f32 runs as cuBLAS matmuls around a causal softmax (exact f32 at matmul
// speed; kernels/cuda/attention_gemm.h); bf16 uses cuDNN's fused attention (D a multiple of
// 8 up to 128, strides multiples of 8 elements, 16-byte aligned data), or our own kernel
// otherwise (any D up to 512, any strides) or when KernelOptions::use_cudnn_attention is
// false. k and v may hold L > T rows (a chunk of a longer sequence, as context parallelism
// splits it): the queries are then positions [L - T, L) and query t attends to keys
// 0 .. L - T + t; on CUDA our own kernels run it. causal = false lets every query see
// every key (a ring block whose keys all come before its queries): cuDNN in bf16, our own
// kernels in f32.
void attention_forward(Context& ctx, const Tensor& out, const Tensor& lse, const Tensor& q,
                       const Tensor& k, const Tensor& v, double scale = 0.0, bool causal = true);
// Attention of new queries over a key/value cache, for generation (forward only): q
// (B, Tq, H, D) holds the queries of positions [L - Tq, L); k and v (B, L, Hkv, D) the keys
// and values of positions [0, L), L >= Tq (usually views of the first L rows of a larger
// cache). Query t attends to keys 0 .. L - Tq + t. out (B, Tq, H, D) contiguous. Same
// stride rules as attention_forward; on CUDA always our own kernel (its one-warp-per-query
// loop is what decoding one token needs).
void attention_with_cache(Context& ctx, const Tensor& out, const Tensor& q, const Tensor& k,
                          const Tensor& v, double scale = 0.0);
// dq (B, T, H, D), dk and dv (B, L, Hkv, D) as k, same stride rules; overwritten.
void attention_backward(Context& ctx, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                        const Tensor& dout, const Tensor& out, const Tensor& lse,
                        const Tensor& q, const Tensor& k, const Tensor& v, double scale = 0.0, bool causal = true);

// Context parallelism's ring: merges a block's attention block_out (B, T, H, D) with its
// log-sum-exp block_lse (B, H, T) into the running out (B, T, H, D) and lse (B, H, T) (both
// of the statistics dtype: f32, f64 for f64; lse -inf and out 0 before the first block):
// lse' = log(exp(lse) + exp(block_lse)), out' = out e^(lse - lse') + block_out e^(block_lse - lse').
void attention_merge(Context& ctx, const Tensor& out, const Tensor& lse, const Tensor& block_out,
                     const Tensor& block_lse);

// ---------------------------------------------------------------- fused cross-entropy
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

// ---------------------------------------------------------------- mixture of experts
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

// ---------------------------------------------------------------- optimizer
struct AdamWParams {
  double lr = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0;  // decoupled: param -= lr * weight_decay * param
  int64_t step = 1;         // 1 for the first update (bias correction uses it)
  double grad_scale = 1;    // gradients are multiplied by this first (clipping, 1/N)
};
// One fused AdamW update of n elements: param (f32 master or f64), grad (any floating),
// exp_avg / exp_avg_sq (f32, or bf16 to save memory). When `param_copy` is defined it
// receives the updated parameter in its own dtype (the bf16 compute weights).
void adamw_step(Context& ctx, const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const AdamWParams& p, const Tensor& param_copy = Tensor());
// The same update on host tensors computed in f32, with the CUDA kernel's roundings, at the
// speed of the host's memory (the CPU reference above computes in double): the
// CPU-offloaded optimizer's update. f32 master weights; gradient, moments and copy f32 or
// bf16.
void adamw_step_host_f32(Context& host, const Tensor& param, const Tensor& grad,
                         const Tensor& exp_avg, const Tensor& exp_avg_sq, const AdamWParams& p,
                         const Tensor& param_copy = Tensor());

// ---------------------------------------------------------------- initialization
// Counter-based, slice-invariant random init: element i of the parameter identified by
// (seed, key) is a function of (seed, key, i) alone, so initializing elements
// [offset, offset + out.numel()) of a parameter alone gives exactly the same values as the
// same slice of a full initialization. `key` is a hash of the parameter's name.
void init_normal(Context& ctx, const Tensor& out, uint64_t seed, uint64_t key, int64_t offset,
                 double mean, double std);
void init_uniform(Context& ctx, const Tensor& out, uint64_t seed, uint64_t key, int64_t offset,
                  double low, double high);
// Stable 64-bit hash of a parameter name (FNV-1a), the `key` above.
uint64_t name_key(const std::string& name);

}  // namespace fsdp::ops
