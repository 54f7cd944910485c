// Differentiable ops: each runs its forward kernel (kernels/ops.h) and, when the graph is
// recording, records one node whose backward adds into its inputs' and parameters' gradients.
//
// Rules every op here follows:
// - Inputs are whole tensors produced by earlier ops (or leaves); views are taken inside the
//   ops, since a view carries no autograd record.
// - Parameters are passed as Parameter&, and backward reads parameter.data and
//   parameter.grad when it runs (FSDP may have re-gathered the weights into other buffers in
//   between); parameter gradients are ACCUMULATED, allocated zeroed if undefined.
// - Activations and their gradients have the parameters' compute dtype; statistics saved for
//   backward (norm rstd, attention log-sum-exp, losses) are f32, f64 for f64 compute.
// Shapes: B batch, T time, C channels, H heads, Hkv key/value heads, D head dim, Vp padded
// vocabulary, F hidden features; "..." any leading dimensions.
#pragma once

#include <cstdint>
#include <optional>

#include "kernels/ops.h"
#include "runtime/autograd/graph.h"
#include "runtime/nn/parameter.h"
#include "runtime/nn/tensor_parallel.h"

namespace fsdp::nn {

using autograd::Graph;

// y (..., out) = x (..., in) @ weight (out, in)^T [+ bias (out)], then GELU (tanh) when
// epilogue is Gelu (fused into the matmul; the pre-activation is saved for backward).
// `column`: a column-parallel layer's input exchange (ColumnParallelInput).
Tensor linear(Graph& g, const Tensor& x, Parameter& weight, Parameter* bias = nullptr,
              ops::Epilogue epilogue = ops::Epilogue::None,
              const ColumnParallelInput& column = {});

// out (B, T, C) = wte[idx] (+ wpe[t]): idx (B, T) i32, wte (V, C), wpe (T', C), T <= T'.
// out has the tables' dtype, or `out_dtype` when given (the residual stream's dtype: f32
// beside bf16 tables on CUDA).
Tensor embedding(Graph& g, const Tensor& idx, Parameter& wte, Parameter* wpe = nullptr,
                 std::optional<DType> out_dtype = std::nullopt);

// LayerNorm / RMSNorm over the last dimension of x (..., C). The output has the weight's
// dtype; x may be wider (an f32 residual stream beside bf16 weights on CUDA), and its
// gradient then is too.
Tensor layer_norm(Graph& g, const Tensor& x, Parameter& weight, Parameter& bias, double eps);
Tensor rms_norm(Graph& g, const Tensor& x, Parameter& weight, double eps);

// The residual add and the norm that reads its result, as one forward kernel:
// sum = x + residual (add()'s dtypes and rounding) and out = norm(sum). The backward is
// add()'s and the norm's, so results equal the two ops run one after the other; the fused
// forward saves one read of the stream per block.
struct AddNorm {
  Tensor sum;  // (..., C), x's dtype: the residual stream after the add
  Tensor out;  // (..., C), the weight's dtype: the norm of sum
};
AddNorm add_layer_norm(Graph& g, const Tensor& x, const Tensor& residual, Parameter& weight,
                       Parameter& bias, double eps);
AddNorm add_rms_norm(Graph& g, const Tensor& x, const Tensor& residual, Parameter& weight,
                     double eps);

// GELU (tanh form), elementwise.
Tensor gelu(Graph& g, const Tensor& x);
// x (..., 2F) = [gate | up] -> (..., F) = silu(gate) * up.
Tensor swiglu(Graph& g, const Tensor& x);
// The transformer MLP, y (..., C) = proj(act(fc(x))), as one op: GELU (fc (F, C)) or SwiGLU
// (fc (2F, C) = [gate | up]); proj (C, F); biases optional. Saves x, the activation's input
// and, unless `recompute_activation`, the activation itself; backward recomputes the
// activation when it was not saved (F values per token less memory for one elementwise
// pass), and computes GELU's gradient inside the matmul that produces it.
enum class MlpActivation { Gelu, SwiGLU };
// `column`: fc's input exchange when it is column-parallel (ColumnParallelInput).
Tensor mlp(Graph& g, const Tensor& x, Parameter& fc_weight, Parameter* fc_bias,
           Parameter& proj_weight, Parameter* proj_bias, MlpActivation activation,
           bool recompute_activation, const ColumnParallelInput& column = {});
namespace detail {
// out (N, F) = the MLP activation of h: GELU of h (N, F), or SwiGLU of h (N, 2F) (the MLP's
// and the experts' forward and recompute).
void mlp_activation(Context& ctx, MlpActivation act, const Tensor& out, const Tensor& h);
}  // namespace detail

// a + b, same shapes (the residual stream): the result has a's dtype, and b may be narrower
// (a bf16 branch added to an f32 stream; b's gradient is then the stream's, rounded once).
Tensor add(Graph& g, const Tensor& a, const Tensor& b);

// x (B, T, H, D) rotated by position ("rotate half", Hugging Face Llama's convention).
Tensor rope(Graph& g, const Tensor& x, double theta);

// Causal self-attention on a fused projection: qkv (B, T, (H + 2 Hkv) D) holds
// [q (H heads) | k (Hkv heads) | v (Hkv heads)] per token; returns (B, T, H D). With
// rope_theta > 0, q and k are rotated first (on copies: qkv is left as it is).
Tensor causal_attention(Graph& g, const Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                        double rope_theta = 0.0);

// Generation (not differentiable: nothing is recorded): causal self-attention of new tokens
// over a key/value cache. qkv (B, Tn, (H + 2 Hkv) D) is the fused projection of the tokens at
// positions [position, position + Tn). Their keys (rotated first when rope_theta > 0) and
// values are written into rows [position, position + Tn) of keys and values
// (B, capacity, Hkv, D); each new token then attends to rows 0 .. its own position.
// Returns (B, Tn, H D), as causal_attention does for the same tokens.
Tensor cached_attention(Context& ctx, const Tensor& qkv, const Tensor& keys, const Tensor& values,
                        int64_t position, int64_t n_head, int64_t n_kv_head,
                        double rope_theta = 0.0);

// Mean softmax cross-entropy over the non-ignored targets: logits (..., Vp), targets (...)
// i32 in [0, vocab_size) or -1 (ignored); the padded columns [vocab_size, Vp) take no part.
// Returns a one-element tensor (f32; f64 for f64 logits). `n_valid` is the number of
// targets != -1 if the caller knows it; -1 counts them (reading targets back to the host,
// which synchronizes with the device). All targets ignored gives a loss of 0.
//
// Memory: forward keeps only the logits and one log-sum-exp per row; backward writes the
// logit gradients IN PLACE into the logits buffer when the logits are an op's output that
// nothing else has sent a gradient to (the lm_head's): the probabilities are never stored.
// The caller must not read `logits` after backward expecting logits.
Tensor cross_entropy(Graph& g, const Tensor& logits, const Tensor& targets, int64_t vocab_size,
                     int64_t n_valid = -1);

// The classifier and its loss as one op: the mean softmax cross-entropy of
// logits = x (..., C) @ weight (Vp, C)^T against targets (...) (i32 in [0, vocab_size) or
// -1, ignored), as cross_entropy(linear(x, weight), ...) computes it (same `n_valid` rule),
// without ever holding the (..., Vp) logits: the rows are processed `chunk_rows` at a time
// (0 = all in one chunk) through one reused (chunk_rows, Vp) buffer. The weight may be tied
// (GPT-2's token embedding): its gradient is ADDED to what the embedding sends.
//
// When the graph records, the forward also computes the gradients (one kernel per chunk
// writes each row's loss and replaces its logits by d loss / d logits, then two matmuls
// give dx and the chunk's share of dW) and keeps dx (..., C) and an f32 dW (Vp, C) for
// backward, which scales them by the upstream gradient and adds them into x's gradient and
// weight.grad (read when backward runs, as every op does). Without recording (evaluation),
// only the losses are computed, chunk by chunk.
Tensor classifier_loss(Graph& g, const Tensor& x, Parameter& weight, const Tensor& targets,
                       int64_t vocab_size, int64_t n_valid, int64_t chunk_rows);

// The statistics dtype for a compute dtype: f64 for f64, f32 otherwise.
DType stat_dtype(DType compute);

}  // namespace fsdp::nn
