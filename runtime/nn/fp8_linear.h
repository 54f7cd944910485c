// The three products of a linear layer in FP8 (a weight with Parameter::fp8): the forward
// y = x W^T, the input gradient dx = dy W and the weight gradient dW += dy^T x, each from
// operands quantized tensor-wise or block-wise (nn::Fp8Recipe). FP8 tensor cores read both operands
// K-major, so each operand is quantized in the layout its product needs: x and W row-major
// for the forward; dy row-major and W transposed for dx; dy and x transposed for dW (one
// kernel writes both layouts of dy). Not a public header: linear() and mlp() call it.
#pragma once

#include "kernels/ops.h"
#include "runtime/nn/parameter.h"

namespace fsdp::nn::fp8 {

// What an FP8 operand is read from (kernels/fp8_format.h): a tensor, or an activation's
// tensors (x its input, dout the gradient at its output), which tensor-wise and delayed
// casts read directly, so the operand itself is never stored.
struct Source {
  ops::Fp8CastSource kind = ops::Fp8CastSource::tensor;
  Tensor x, dout;
  Source(const Tensor& t) : x(t) {}  // NOLINT: a tensor is its own source
  Source(ops::Fp8CastSource k, const Tensor& act_x, const Tensor& act_dout = Tensor())
      : kind(k), x(act_x), dout(act_dout) {}
};

// Whether the layer of `weight` runs its products in FP8 for an input of `rows` rows: the
// weight is marked and every size fits FP8 tensor cores (multiples of 16; of 128 under the
// blockwise recipe, whose three products each take one of the sizes as K). A weight gathered
// in FP8 (Fp8Weight::bytes) has no other form: for it, false throws, naming the layer.
bool applies(const Parameter& weight, int64_t rows);

// y (N, out) = x (N, in) @ W^T [+ bias] [Gelu: aux (N, out) receives the pre-activation],
// x from its source (a tensor, or SwiGLU's input (N, 2 in)).
// With keep_input, returns x's transposed FP8 copy (in, N) for the weight gradient, written
// by the same kernel that quantizes x for the forward (x is read once; the layer then keeps
// one byte per element instead of x's two); undefined otherwise.
ops::Fp8Matrix forward(Context& ctx, const Tensor& y, const Source& x, const Parameter& weight,
                       const Tensor& bias, ops::Epilogue epilogue, const Tensor& aux,
                       bool keep_input);

// x (N, in)'s transposed FP8 copy (in, N) for the weight gradient, from x's source (an input
// recomputed in backward).
ops::Fp8Matrix input_columns(Context& ctx, const Source& x, const Parameter& weight);

// An output gradient dy (N, out) quantized once for both backward products: rows (N, out)
// for dx, columns (out, N) for dW; the bias gradient db (out) += column sums of dy comes
// from the same read of dy.
ops::Fp8Quantized quantize_output_grad(Context& ctx, const Tensor& dy, const Parameter& weight,
                                       Parameter* bias);

// The same for an output gradient that is the gradient at an activation's input
// (activation gelu_grad or swiglu_grad, kernels/fp8_format.h) from da, the gradient at its
// output, and h, its input (GELU: both (N, out); SwiGLU: (N, out / 2) and (N, out)): under
// tensor-wise and delayed scaling the cast computes it as it reads da and h, so it is never
// stored (the bytes are those of quantize_output_grad of the activation's backward); the
// block and row recipes compute it first.
ops::Fp8Quantized quantize_activation_grad(Context& ctx, ops::Fp8CastSource activation,
                                           const Tensor& da, const Tensor& h,
                                           const Parameter& weight, Parameter* bias);

// dx (N, in) = dy @ W + beta * dx [DGelu: times gelu'(aux), beta 0].
void input_grad(Context& ctx, const Tensor& dx, const ops::Fp8Quantized& dy, const Parameter& weight,
                double beta, ops::Epilogue epilogue = ops::Epilogue::None,
                const Tensor& aux = Tensor());

// dW (out, in) += dy^T @ x, x given as its transposed FP8 copy (in, N) (forward's
// keep_input, or input_columns).
void weight_grad(Context& ctx, Parameter& weight, const ops::Fp8Quantized& dy,
                 const ops::Fp8Matrix& x_columns);
// The same into dw (out, in) (f32 or bf16), dw = dy^T @ x + beta * dw.
void weight_grad_into(Context& ctx, const Tensor& dw, const ops::Fp8Quantized& dy,
                      const ops::Fp8Matrix& x_columns, double beta);

}  // namespace fsdp::nn::fp8
