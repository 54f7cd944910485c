// Matmuls and bias gradients at the Tensor level (kernels/ops.h has the conventions):
// kernels/matmul.cc routes them to kernels/cpu/matmul.h or to cuBLASLt through
// kernels/cuda/matmul.h (bias sums: kernels/cuda/column_sum.h).
#pragma once

#include "kernels/nn_shapes.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp::ops {

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

}  // namespace fsdp::ops
