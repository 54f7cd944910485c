// Plain descriptions of the transformer ops' problems, passed by value to the raw kernels of
// both backends (which never see a Tensor). Sizes and strides are in elements. Saved
// statistics (norm mean/rstd, log-sum-exps, losses) are f32, or f64 when the compute dtype
// is f64.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"
#include "runtime/core/dtype.h"

namespace fsdp::kernels {

// out (M, N) = alpha * op(a) @ op(b) + beta * out, for `batch` independent problems.
// a is (M, K) row-major, or (K, M) when trans_a; b is (K, N), or (N, K) when trans_b; out is
// (M, N) row-major. Every matrix is dense (leading dimension = its row length).
struct MatmulDims {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t batch = 1;
  int64_t batch_stride_a = 0, batch_stride_b = 0, batch_stride_out = 0;

  FSDP_HD int64_t lda() const { return trans_a ? m : k; }
  FSDP_HD int64_t ldb() const { return trans_b ? k : n; }
};

// What a matmul does with its product before storing it.
enum class MatmulEpilogue : uint8_t {
  None,   // out = alpha op(a) op(b) (+ beta out) (+ bias)
  Gelu,   // out = gelu(alpha op(a) op(b) + bias); aux (if given) receives the pre-activation
  DGelu,  // out = (alpha op(a) op(b)) * gelu'(aux): the gradient through a GELU whose input
          // was aux (read), as the backward of a Gelu matmul needs it
  BiasGrad,  // out = alpha op(a) op(b) (+ beta out); aux (M, f32) = the sums over K of op(a):
             // a weight gradient dy^T x and the bias gradient of dy from one read (CUDA only)
};

// Strides of a (B, T, heads, D) tensor whose last dimension is contiguous.
struct HeadStrides {
  int64_t b = 0, t = 0, h = 0;
};

// Rotary position embeddings ("rotate half"): out (B, T, H, D) = x rotated pair by pair,
// (i, i + D/2) of row t by the angle (position_offset + t) * theta^(-2i/D) (its opposite
// when inverse). out is x itself (in place) or does not overlap it.
struct RopeDims {
  int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;
  HeadStrides x, out;
  double theta = 0;
  bool inverse = false;
  int64_t position_offset = 0;
};

// Causal grouped-query attention: H query heads share Hkv key/value heads (head h reads
// key/value head h / (H / Hkv)).
struct AttentionDims {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  // Forward only: keys that come before the first query (a key/value cache's earlier
  // positions). Keys and values then hold past + seq rows and query t attends to keys
  // 0 .. past + t. 0 in training.
  int64_t past = 0;
  // false: every query sees every key (a block of context parallelism's ring whose keys all
  // come before its queries); our own kernels only.
  bool causal = true;
  double scale = 0;  // multiplies q . k before the softmax
  HeadStrides q, k, v, out;
  HeadStrides dout, dq, dk, dv;  // backward only

  FSDP_HD int64_t group() const { return heads / kv_heads; }
  // The last key query t sees.
  FSDP_HD int64_t last_key(int64_t t) const { return causal ? past + t : past + seq - 1; }
  // The first query that sees key j.
  FSDP_HD int64_t first_query(int64_t j) const { return causal && j > past ? j - past : 0; }
};

// Norms over the last dimension of contiguous (rows, channels) data.
struct NormDims {
  int64_t rows = 0, channels = 0;
  DType dtype = DType::f32;       // out, dout, weight, bias
  DType x_dtype = DType::f32;     // x and dx: dtype, or f32 beside bf16 (an f32 residual stream)
  DType grad_dtype = DType::f32;  // dweight, dbias
};

// Token (and learned position) embeddings of a (B, T) batch of token ids.
struct EmbeddingDims {
  int64_t batch = 0, seq = 0, channels = 0, vocab = 0;  // vocab: the table's rows
  // A vocabulary-parallel shard: the table's rows are ids [vocab_begin, vocab_begin + vocab)
  // of ids [0, vocab_total); other ids give zero rows and no gradient. A whole table has
  // vocab_begin 0 and vocab_total == vocab.
  int64_t vocab_begin = 0, vocab_total = 0;
  DType dtype = DType::f32;       // forward: wte, wpe; backward: dout
  DType out_dtype = DType::f32;   // forward's out: dtype, or f32 beside bf16 tables
  DType grad_dtype = DType::f32;  // dwte, dwpe
};

// Softmax cross-entropy over rows of padded logits: classes [0, vocab), padding up to
// padded_vocab. A vocabulary-parallel shard's rows hold padded_vocab columns from class
// vocab_begin on (columns at or past class `vocab` are padding); a whole row has
// vocab_begin 0.
struct CrossEntropyDims {
  int64_t rows = 0, padded_vocab = 0, vocab = 0, vocab_begin = 0;
  DType dtype = DType::f32;
  // The columns that hold classes: [0, live_columns()).
  int64_t live_columns() const {
    const int64_t n = vocab - vocab_begin;
    return n < 0 ? 0 : (n > padded_vocab ? padded_vocab : n);
  }
};

// Mixture of experts: how a router turns its logits into scores.
enum class RouterScore : uint8_t {
  Softmax,  // over the row's experts (Mixtral, Qwen3-MoE, OLMoE)
  Sigmoid,  // per expert (DeepSeek-V3)
};

// Top-k routing of `tokens` rows of `experts` logits. The scores and weights (and their
// gradients) are f32, f64 when the logits are f64.
struct RouterDims {
  int64_t tokens = 0, experts = 0, top_k = 0;
  RouterScore score = RouterScore::Softmax;
  bool normalize = true;     // the k chosen weights are divided by their sum
  DType dtype = DType::f32;  // logits and their gradient
};

// The router's auxiliary losses: `tokens` tokens in `groups` equal runs (the sequences of
// seq_aux_loss; one run for aux_loss), each with top_k choices among `experts`. The scores,
// their gradient and the per-token terms are f32, f64 when the logits are f64.
struct MoeLossDims {
  int64_t tokens = 0, experts = 0, top_k = 0, groups = 1;
  // The balancing loss's runs as a whole: the tokens of each run over every rank holding a
  // part of it (context parallelism splits the sequences; 0: the run is all here).
  int64_t run_tokens = 0;
  bool sigmoid = false;      // sigmoid scores: normalized per token for the balancing loss
  DType dtype = DType::f32;  // logits and their gradient
};

// Token rows sent to their experts: `tokens` rows of `channels`, each to top_k experts, give
// tokens * top_k rows grouped by expert. The combine weights are f32, f64 for f64 rows.
struct MoeRowsDims {
  int64_t tokens = 0, top_k = 0, channels = 0;
  DType dtype = DType::f32;  // every row tensor and its gradient
  int64_t rows() const { return tokens * top_k; }
};

// The buffers of one fused AdamW update (n contiguous elements each).
struct AdamWBuffers {
  void* param = nullptr;  // f32 or f64
  DType param_dtype = DType::f32;
  const void* grad = nullptr;  // any floating
  DType grad_dtype = DType::f32;
  void* exp_avg = nullptr;  // both any floating
  void* exp_avg_sq = nullptr;
  DType moment_dtype = DType::f32;
  void* param_copy = nullptr;  // optional, any floating
  DType copy_dtype = DType::bf16;
};

// Muon's orthogonalization of `batch` matrices of (rows, cols), one after another: each is
// divided by its Frobenius norm (at least eps), then `steps` quintic Newton-Schulz iterations
// X <- a X + (b A + c A^2) X with A = X X^T run on its wide orientation (the transpose of a
// tall matrix), which leaves it near U V^T of its singular value decomposition.
struct NewtonSchulzDims {
  int64_t batch = 1, rows = 0, cols = 0;
  FSDP_HD bool tall() const { return rows > cols; }
  FSDP_HD int64_t short_side() const { return rows > cols ? cols : rows; }  // m
  FSDP_HD int64_t long_side() const { return rows > cols ? rows : cols; }   // n
};
struct NewtonSchulzScalars {
  int steps = 5;
  double a = 3.4445, b = -4.7750, c = 2.0315;
  double eps = 1e-7;
};

}  // namespace fsdp::kernels
