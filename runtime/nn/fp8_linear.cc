#include "runtime/nn/fp8_linear.h"

#include "kernels/nn_ops.h"

namespace fsdp::nn::fp8 {
namespace {

// t (R, C) quantized with the scale of its own amax (tensor-wise current scaling);
// add_column_sums (C) += t's column sums from the same read, when defined.
ops::Fp8Quantized quantize(Context& ctx, const Tensor& t, kernels::Fp8Format format, bool rows,
                           bool columns, const Tensor& add_column_sums = Tensor()) {
  const Tensor amax = ctx.empty(Shape{1}, DType::f32);
  ops::fp8_amax(ctx, amax, t);
  return ops::fp8_quantize(ctx, t, amax, format, rows, columns, add_column_sums);
}

}  // namespace

bool applies(const Parameter& weight, int64_t rows) {
  if (!weight.fp8 || !weight.data.defined() || weight.data.dim() != 2) return false;
  return ops::fp8_shape_ok(rows, weight.data.size(0), weight.data.size(1));
}

ops::Fp8Matrix forward(Context& ctx, const Tensor& y, const Tensor& x, const Parameter& weight,
                       const Tensor& bias, ops::Epilogue epilogue, const Tensor& aux,
                       bool keep_input) {
  const kernels::Fp8Format f = weight.fp8->forward;
  const ops::Fp8Quantized qx = quantize(ctx, x, f, true, keep_input);  // (N, in), (in, N)
  const ops::Fp8Matrix qw = quantize(ctx, weight.checked_data(), f, true, false).rows;  // (out, in)
  // Fast accumulation in the forward only, as Transformer Engine's recipes do: gradients
  // keep the more exact accumulation.
  ops::fp8_matmul(ctx, y, qx.rows, qw, 1.0, 0.0, bias, epilogue, aux, /*fast_accum=*/true);
  return qx.columns;
}

ops::Fp8Matrix input_columns(Context& ctx, const Tensor& x, const Parameter& weight) {
  return quantize(ctx, x, weight.fp8->forward, false, true).columns;
}

ops::Fp8Quantized quantize_output_grad(Context& ctx, const Tensor& dy, const Parameter& weight,
                                       Parameter* bias) {
  const Tensor db = bias ? bias->grad_for_accumulation(ctx) : Tensor();
  return quantize(ctx, dy, weight.fp8->backward, true, true, db);
}

void input_grad(Context& ctx, const Tensor& dx, const ops::Fp8Quantized& dy, const Parameter& weight,
                double beta, ops::Epilogue epilogue, const Tensor& aux) {
  // W^T (in, out): the weight with the output features as K.
  const ops::Fp8Matrix qwt =
      quantize(ctx, weight.checked_data(), weight.fp8->forward, false, true).columns;
  ops::fp8_matmul(ctx, dx, dy.rows, qwt, 1.0, beta, Tensor(), epilogue, aux);
}

void weight_grad(Context& ctx, Parameter& weight, const ops::Fp8Quantized& dy,
                 const ops::Fp8Matrix& x_columns) {
  ops::fp8_matmul(ctx, weight.grad_for_accumulation(ctx), dy.columns, x_columns, 1.0, 1.0);
}

}  // namespace fsdp::nn::fp8
