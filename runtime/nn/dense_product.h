// The products of the dense layers, one helper each, shared by nn::linear, nn::mlp,
// nn::classifier_loss and the MoE router (not a public header): the column-parallel input
// under sequence parallelism, and the forward, input-gradient and weight-gradient products,
// each in FP8 (where the FP8 plan marked the weight) or in the compute dtype.
#pragma once

#include <optional>

#include "kernels/ops.h"
#include "runtime/nn/fp8_linear.h"
#include "runtime/nn/op_support.h"
#include "runtime/nn/parameter.h"
#include "runtime/nn/tensor_parallel.h"

namespace fsdp::nn::detail {

// A layer's input x (..., C) as its first product reads it. Under sequence parallelism
// (column.group and column.sequence) x is this rank's part (B, T/tp, C) and the product reads
// the whole (B, T, C), gathered from every rank.
struct ProductInput {
  bool gathered = false;
  Tensor whole;  // (..., C): x, or the gathered sequence
  Tensor rows;   // (N, C): whole as a contiguous matrix
};

inline ProductInput product_input(Context& ctx, const Tensor& x, const ColumnParallelInput& column,
                                  int64_t features, const char* op, const Parameter& weight) {
  ProductInput in;
  in.gathered = column.group && column.sequence;
  FSDP_CHECK(!in.gathered || x.dim() == 3, ShapeError, op, " ", weight.name(), ": a sequence-"
             "parallel input must be (B, T/tp, C), got ", x.str());
  in.whole = in.gathered ? SequenceExchange::start_gather(ctx, x, *column.group).finish(ctx) : x;
  in.rows = rows(ctx, in.whole, features);
  return in;
}

// out (N, out) = in (N, in) @ W^T [+ b] [epilogue, with aux], in FP8 when in_fp8
// (fp8::applies said so) or in the compute dtype. In FP8, with keep_input, the input's
// transposed FP8 copy (in, N) for the weight gradient is returned (else nothing).
inline ops::Fp8Matrix product(Context& ctx, const Tensor& out, const fp8::Source& in,
                              const Parameter& w, bool in_fp8, const Tensor& b, ops::Epilogue ep,
                              const Tensor& aux, bool keep_input) {
  if (in_fp8) return fp8::forward(ctx, out, in, w, b, ep, aux, keep_input);
  ops::matmul(ctx, out, in.x, w.checked_data(), false, true, 1.0, 0.0, b, ep, aux);
  return ops::Fp8Matrix();
}

// dx (N, in) = dy (N, out) @ W (out, in) + beta dx [DGelu: times gelu'(aux), beta 0], from
// dy's FP8 copy q when the layer runs in FP8 (q given), else in the compute dtype.
inline void input_product(Context& ctx, const Tensor& dx, const Tensor& dy,
                          const std::optional<ops::Fp8Quantized>& q, const Parameter& w,
                          double beta, ops::Epilogue ep = ops::Epilogue::None,
                          const Tensor& aux = Tensor()) {
  if (q)
    fp8::input_grad(ctx, dx, *q, w, beta, ep, aux);
  else
    ops::matmul(ctx, dx, dy, w.checked_data(), false, false, 1.0, beta, Tensor(), ep, aux);
}

// dW (out, in) += dy^T (out, N) @ x (N, in) [db (out) += column sums of dy]: in FP8 (q
// given) from x's transposed FP8 copy (the forward's, or quantized again from x now), else
// in the compute dtype.
inline void weight_product(Context& ctx, Parameter& w, Parameter* bias, const Tensor& dy,
                           const std::optional<ops::Fp8Quantized>& q,
                           const ops::Fp8Matrix& x_columns, const Tensor& x) {
  if (q)
    fp8::weight_grad(ctx, w, *q, x_columns.defined() ? x_columns : fp8::input_columns(ctx, x, w));
  else
    weight_and_bias_grad(ctx, w, bias, dy, x);
}

}  // namespace fsdp::nn::detail
