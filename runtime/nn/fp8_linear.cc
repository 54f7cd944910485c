#include "runtime/nn/fp8_linear.h"

#include "kernels/ops.h"
#include "runtime/nn/tensor_parallel.h"

namespace fsdp::nn::fp8 {
namespace {

// amax, the maximum |value| of operand `op` over some axis on this rank, made the maximum
// over every rank holding a part of what it covers: the context-parallel ranks (other
// tokens) when `over_tokens`, the tensor-parallel ones when `over_split`.
void reduce_amax(Context& ctx, const Tensor& amax, const Fp8Recipe& r, bool over_tokens,
                 bool over_split) {
  if (over_tokens && r.token_group && r.token_group->size() > 1)
    r.token_group->all_reduce_max(ctx, amax);
  if (over_split && r.feature_group && r.feature_group->size() > 1)
    r.feature_group->all_reduce_max(ctx, amax);
}

// t (R, C) quantized row-wise: each row of the `rows` layout by its amax over the columns,
// each row of the `columns` layout (t's column) by its amax over t's rows, each amax taken
// over the ranks holding the rest of its row or column.
ops::Fp8Quantized quantize_rowwise(Context& ctx, const Tensor& t, const Fp8Recipe& r, Fp8Operand op,
                                   kernels::Fp8Format f, bool rows, bool columns,
                                   const Tensor& add_column_sums) {
  const Fp8Split split = r.split[size_t(op)];
  const bool tokens = op != Fp8Operand::weight;  // the rows of inputs and gradients
  Tensor row_amax, column_amax;
  if (rows) {
    row_amax = ctx.empty(Shape{t.size(0)}, DType::f32);
    ops::fp8_row_amax(ctx, row_amax, t);
    reduce_amax(ctx, row_amax, r, false, split == Fp8Split::columns);
  }
  if (columns) {
    column_amax = ctx.empty(Shape{t.size(1)}, DType::f32);
    ops::fp8_column_amax(ctx, column_amax, t);
    reduce_amax(ctx, column_amax, r, tokens, split == Fp8Split::rows);
  }
  return ops::fp8_quantize_rowwise(ctx, t, f, row_amax, column_amax, add_column_sums);
}

// The values of a computed source (an activation's, kernels/fp8_format.h), stored.
Tensor computed(Context& ctx, const Source& s) {
  const int64_t cols = kernels::fp8_source_cols(s.kind, s.x.size(-1));
  const Tensor v = ctx.empty(Shape{s.x.numel() / s.x.size(-1), cols}, s.x.dtype());
  if (s.kind == ops::Fp8CastSource::swiglu)
    ops::swiglu_forward(ctx, v, s.x);
  else if (s.kind == ops::Fp8CastSource::gelu_grad)
    ops::gelu_backward(ctx, v, s.dout, s.x);
  else
    ops::swiglu_backward(ctx, v, s.dout, s.x);
  return v;
}

// Operand `op` of weight's layer (R, C), from source s, quantized with the scale its recipe
// gives: tensor-wise from its own amax (taken over the ranks that hold other tokens or other
// features of the operand), or delayed from the amax history, recording its amax for the
// next steps in the same read (in the first step, with no history yet, from its own amax
// too); or by block or by row. add_column_sums (C) += its column sums from the same read,
// when defined. A computed source is read directly by the tensor-wise and delayed casts
// (its values never stored); the block and row casts get its values computed first.
ops::Fp8Quantized quantize(Context& ctx, const Source& s, const Parameter& weight, Fp8Operand op,
                           bool rows, bool columns, const Tensor& add_column_sums = Tensor()) {
  const Fp8Recipe& r = weight.fp8->recipe;
  const kernels::Fp8Format f = op == Fp8Operand::output_grad ? r.backward : r.forward;
  const bool fused = s.kind != ops::Fp8CastSource::tensor;
  const bool by_parts = r.scaling == Fp8Scaling::blockwise || r.scaling == Fp8Scaling::rowwise;
  if (fused && by_parts) return quantize(ctx, Source(computed(ctx, s)), weight, op, rows, columns, add_column_sums);
  const Tensor& t = s.x;
  if (r.scaling == Fp8Scaling::blockwise)  // weights 128x128, inputs and gradients 1x128
    return ops::fp8_quantize_blocks(ctx, t, f,
                                    op == Fp8Operand::weight ? ops::Fp8Granularity::block_128x128
                                                             : ops::Fp8Granularity::block_1x128,
                                    rows, columns, add_column_sums);
  if (r.scaling == Fp8Scaling::rowwise)
    return quantize_rowwise(ctx, t, r, op, f, rows, columns, add_column_sums);
  auto cast = [&](const Tensor& amax, const Tensor& record) {
    return fused ? ops::fp8_quantize_activation(ctx, s.kind, s.dout, s.x, amax, f, rows, columns,
                                                add_column_sums, record)
                 : ops::fp8_quantize(ctx, t, amax, f, rows, columns, add_column_sums, record);
  };
  const bool delayed = r.scaling == Fp8Scaling::delayed;
  const Tensor record = delayed ? r.delayed.step_amax.narrow(0, int(op), 1) : Tensor();
  if (delayed && *r.delayed.primed) return cast(r.delayed.scale_amax.narrow(0, int(op), 1), record);
  const Tensor amax = ctx.empty(Shape{1}, DType::f32);
  if (fused)
    ops::fp8_amax_activation(ctx, amax, s.kind, s.dout, s.x);
  else
    ops::fp8_amax(ctx, amax, t);
  reduce_amax(ctx, amax, r, op != Fp8Operand::weight, r.split[size_t(op)] != Fp8Split::none);
  return cast(amax, record);
}

}  // namespace

bool applies(const Parameter& weight, int64_t rows) {
  const bool gathered = weight.fp8 && weight.fp8->gathered();
  if (!weight.fp8 || (!weight.data.defined() && !gathered) || weight.shape().rank() != 2) return false;
  const bool fits = weight.fp8->recipe.scaling == Fp8Scaling::blockwise
                        ? kernels::fp8_block_shape_ok(rows, weight.shape()[0], weight.shape()[1])
                        : ops::fp8_shape_ok(rows, weight.shape()[0], weight.shape()[1]);
  FSDP_CHECK(fits || !gathered, ShapeError, "layer ", weight.name(), ": its weight is gathered "
             "in FP8 (mixed_precision.fp8_param), but an input of ", rows, " rows does not fit "
             "FP8 tensor cores (a multiple of 16 tokens per micro-batch is needed)");
  return fits;
}

namespace {

// The weight's FP8 form for the forward (out, in) as FSDP gathered it (fp8_param).
ops::Fp8Matrix gathered_rows(const Parameter& weight) {
  return ops::Fp8Matrix{weight.fp8->bytes, weight.fp8->scale_inv, weight.fp8->recipe.forward};
}

// The weight quantized for the forward (rows, (out, in)) or the input gradient (columns,
// (in, out)): cast for this product alone, or under cache_weight both layouts at the first
// product after an update, kept for the products until the next.
ops::Fp8Matrix weight_operand(Context& ctx, const Parameter& weight, bool rows) {
  const bool cache = weight.fp8->recipe.cache_weight;
  if (cache && weight.fp8->cast) return rows ? weight.fp8->cast->rows : weight.fp8->cast->columns;
  const ops::Fp8Quantized q = quantize(ctx, weight.checked_data(), weight, Fp8Operand::weight,
                                       rows || cache, !rows || cache);
  if (cache) weight.fp8->cast = q;
  return rows ? q.rows : q.columns;
}

}  // namespace

ops::Fp8Matrix forward(Context& ctx, const Tensor& y, const Source& x, const Parameter& weight,
                       const Tensor& bias, ops::Epilogue epilogue, const Tensor& aux,
                       bool keep_input) {
  const ops::Fp8Quantized qx =
      quantize(ctx, x, weight, Fp8Operand::input, true, keep_input);  // (N, in), (in, N)
  const ops::Fp8Matrix qw =
      weight.fp8->gathered()
          ? gathered_rows(weight)
          : weight_operand(ctx, weight, true);  // (out, in)
  // Fast accumulation in the forward only, as Transformer Engine's recipes do: gradients
  // keep the more exact accumulation. Block- and row-scaled products have none to offer.
  const bool fast_accum = weight.fp8->recipe.scaling != Fp8Scaling::blockwise &&
                          weight.fp8->recipe.scaling != Fp8Scaling::rowwise;
  ops::fp8_matmul(ctx, y, qx.rows, qw, 1.0, 0.0, bias, epilogue, aux, fast_accum);
  return qx.columns;
}

ops::Fp8Matrix input_columns(Context& ctx, const Source& x, const Parameter& weight) {
  return quantize(ctx, x, weight, Fp8Operand::input, false, true).columns;
}

ops::Fp8Quantized quantize_output_grad(Context& ctx, const Tensor& dy, const Parameter& weight,
                                       Parameter* bias) {
  const Tensor db = bias ? bias->grad_for_accumulation(ctx) : Tensor();
  return quantize(ctx, dy, weight, Fp8Operand::output_grad, true, true, db);
}

ops::Fp8Quantized quantize_activation_grad(Context& ctx, ops::Fp8CastSource activation,
                                           const Tensor& da, const Tensor& h,
                                           const Parameter& weight, Parameter* bias) {
  const Tensor db = bias ? bias->grad_for_accumulation(ctx) : Tensor();
  return quantize(ctx, Source(activation, h, da), weight, Fp8Operand::output_grad, true, true, db);
}

void input_grad(Context& ctx, const Tensor& dx, const ops::Fp8Quantized& dy, const Parameter& weight,
                double beta, ops::Epilogue epilogue, const Tensor& aux) {
  // W^T (in, out): the weight with the output features as K (gathered in FP8: its bytes
  // transposed, same scale).
  ops::Fp8Matrix qwt;
  if (weight.fp8->gathered()) {
    qwt = gathered_rows(weight);
    qwt.data = ops::contiguous(ctx, qwt.data.transpose(0, 1));
  } else {
    qwt = weight_operand(ctx, weight, false);
  }
  ops::fp8_matmul(ctx, dx, dy.rows, qwt, 1.0, beta, Tensor(), epilogue, aux);
}

void weight_grad(Context& ctx, Parameter& weight, const ops::Fp8Quantized& dy,
                 const ops::Fp8Matrix& x_columns) {
  weight_grad_into(ctx, weight.grad_for_accumulation(ctx), dy, x_columns, 1.0);
}

void weight_grad_into(Context& ctx, const Tensor& dw, const ops::Fp8Quantized& dy,
                      const ops::Fp8Matrix& x_columns, double beta) {
  ops::fp8_matmul(ctx, dw, dy.columns, x_columns, 1.0, beta);
}

}  // namespace fsdp::nn::fp8
