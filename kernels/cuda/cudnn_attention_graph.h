// The pieces the bf16 and FP8 attention graphs share (kernels/cuda/cudnn_attention.cu,
// kernels/cuda/cudnn_fp8_attention.cu): cuDNN's (B, heads, rows, D) dims and strides of our
// (B, rows, heads, D) tensors, the packed shapes of the graph's intermediates, and the causal
// mask. Host code, internal to those two files.
#pragma once

#include <memory>
#include <vector>

#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/cudnn_graph.h"
#include "kernels/nn_shapes.h"

namespace fsdp::kernels::cuda::attention_graph {

using cudnn::GraphBuilder;
using cudnn::TensorRef;
using Dims = std::vector<int64_t>;

// The keys' rows: L = past + T.
inline int64_t keys(const AttentionDims& d) { return d.past + d.seq; }
// (B, heads, T, D) and (B, heads, L, D) dims of one of our (B, rows, heads, D) tensors.
inline Dims bhtd(const AttentionDims& d, int64_t heads) { return {d.batch, heads, d.seq, d.head_dim}; }
inline Dims bhld(const AttentionDims& d, int64_t heads) { return {d.batch, heads, keys(d), d.head_dim}; }
inline Dims strides_of(const HeadStrides& s) { return {s.b, s.h, s.t, 1}; }
// The transpose (B, heads, D, L) of the keys' memory.
inline Dims bhdl(const AttentionDims& d, int64_t heads) { return {d.batch, heads, d.head_dim, keys(d)}; }
inline Dims transposed_strides(const HeadStrides& s) { return {s.b, s.h, 1, s.t}; }

struct Shapes {  // dims and packed strides of the graph's intermediates
  Dims scores, scores_strides, scores_t_strides, rows, rows_strides, full, full_strides,
      full_keys, full_keys_strides;
  explicit Shapes(const AttentionDims& d) {
    const int64_t B = d.batch, H = d.heads, T = d.seq, L = keys(d), D = d.head_dim;
    scores = {B, H, T, L};
    scores_strides = {H * T * L, T * L, L, 1};
    scores_t_strides = {H * T * L, T * L, 1, L};  // (B, H, L, T) view of the same scores
    rows = {B, H, T, 1};
    rows_strides = {H * T, T, 1, 1};
    full = {B, H, T, D};
    full_strides = {H * T * D, T * D, D, 1};
    full_keys = {B, H, L, D};  // a key-side product before its sum over a head group
    full_keys_strides = {H * L * D, L * D, D, 1};
  }
};

// scores masked to the causal lower triangle: x where row + past >= col, else neg_inf (the
// mask cuDNN knows as bottom-right aligned when past > 0; `past_uid` names the by-value
// int32 offset then).
inline TensorRef causal_mask(GraphBuilder& g, const AttentionDims& d, const Shapes& s, TensorRef x,
                             TensorRef neg_inf, int64_t past_uid) {
  TensorRef row = g.virtual_tensor(s.scores, s.scores_strides, CUDNN_DATA_INT32);
  TensorRef col = g.virtual_tensor(s.scores, s.scores_strides, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, {}, row, CUDNN_DATA_INT32, {}, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, {}, col, CUDNN_DATA_INT32, {}, 3);
  if (d.past > 0) {
    TensorRef shifted = g.virtual_tensor(s.scores, s.scores_strides, CUDNN_DATA_INT32);
    g.pointwise(CUDNN_POINTWISE_ADD, row, g.scalar(past_uid, CUDNN_DATA_INT32), shifted,
                CUDNN_DATA_INT32);
    row = shifted;
  }
  TensorRef keep = g.virtual_tensor(s.scores, s.scores_strides, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, col, keep, CUDNN_DATA_BOOLEAN);
  TensorRef y = g.virtual_tensor(s.scores, s.scores_strides, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, neg_inf, y, CUDNN_DATA_FLOAT, keep);
  return y;
}

// P = softmax(scores) over each row of the (B, H, T, L) f32 scores, with its statistics
// lse = max + log(sum exp(scores - max)) written into `lse` (B, H, T, 1): the softmax cuDNN's
// flash attention recognizes. P has `p_type` (what the product with V reads).
inline TensorRef softmax_with_stats(GraphBuilder& g, const Shapes& s, TensorRef scores, TensorRef lse,
                                    cudnnDataType_t p_type) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  TensorRef max = g.virtual_tensor(s.rows, s.rows_strides, f32);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, scores, max);
  TensorRef shifted = g.virtual_tensor(s.scores, s.scores_strides, f32);
  g.pointwise(CUDNN_POINTWISE_SUB, scores, max, shifted);
  TensorRef e = g.virtual_tensor(s.scores, s.scores_strides, f32);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, {}, e);
  TensorRef z = g.virtual_tensor(s.rows, s.rows_strides, f32);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  TensorRef log_z = g.virtual_tensor(s.rows, s.rows_strides, f32);
  g.pointwise(CUDNN_POINTWISE_LOG, z, {}, log_z);
  g.pointwise(CUDNN_POINTWISE_ADD, max, log_z, lse);
  TensorRef p = g.virtual_tensor(s.scores, s.scores_strides, p_type);
  g.pointwise(CUDNN_POINTWISE_DIV, e, z, p);
  return p;
}

// Ids of the tensors an FP8 graph's caller supplies at execution: the tensors, the by-value
// softmax scale and -inf, then kFp8Scale + Fp8AttentionScalar and kFp8Amax + Fp8AttentionAmax.
enum Fp8Uid : int64_t {
  kFp8Q = 1, kFp8K, kFp8V, kFp8O, kFp8Stats, kFp8DO, kFp8DQ, kFp8DK, kFp8DV, kFp8AttnScale,
  kFp8NegInf, kFp8Scale = 100, kFp8Amax = 200
};

// The FP8 forward and backward graphs (kernels/cuda/cudnn_fp8_attention.cu); throw CudaError
// when cuDNN builds no plan.
std::unique_ptr<cudnn::Plan> fp8_forward_plan(cudnnHandle_t handle, const AttentionDims& d,
                                              const Fp8AttentionTypes& types);
std::unique_ptr<cudnn::Plan> fp8_backward_plan(cudnnHandle_t handle, const AttentionDims& d,
                                               const Fp8AttentionTypes& types);

}  // namespace fsdp::kernels::cuda::attention_graph
