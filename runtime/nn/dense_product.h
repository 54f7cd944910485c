// What the dense layers' products share (nn::linear and nn::mlp; not a public header): the
// column-parallel input under sequence parallelism, and one product in FP8 or in the compute
// dtype.
#pragma once

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

}  // namespace fsdp::nn::detail
