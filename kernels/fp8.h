// FP8 at the Tensor level: quantization and FP8 matmuls (Hopper's FP8 tensor cores through
// cuBLASLt on CUDA; on the CPU a simulation for tests, with the GPU's exact bytes and
// scales). kernels/fp8.cc routes them to kernels/cpu/fp8.h or kernels/cuda/fp8.h (block and
// row scaling: fp8_blocks.h, fp8_rows.h). kernels/fp8_format.h has the formats and the
// scaling rule.
#pragma once

#include <string>

#include "kernels/fp8_format.h"
#include "kernels/matmul.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"

namespace fsdp::ops {

using Fp8Format = kernels::Fp8Format;
using Fp8Granularity = kernels::Fp8Granularity;
using Fp8CastSource = kernels::Fp8CastSource;

// An FP8 matrix: bytes (rows, cols) u8, K-major (cols is the K of the products reading it),
// and the inverses of their scales, f32 on the same device. Tensor-wise: scale_inv is (1)
// and element (r, c) stands for decode(data[r][c]) * scale_inv. Block-wise (1x128 or
// 128x128 blocks): scale_inv holds one inverse scale per block, shaped and ordered as
// kernels::fp8_scale_grid(granularity, rows, cols) (cuBLASLt's layout), and element (r, c)
// stands for decode(data[r][c]) * scale_inv[fp8_scale_index(..., r, c)].
struct Fp8Matrix {
  Tensor data;
  Tensor scale_inv;
  Fp8Format format = Fp8Format::e4m3;
  Fp8Granularity granularity = Fp8Granularity::tensor;
  bool defined() const { return data.defined(); }
};

// A matrix quantized once for both ways FP8 matmuls read it: `rows` (R, C) and `columns`
// (C, R), the transpose (either may be left undefined); one scale.
struct Fp8Quantized {
  Fp8Matrix rows, columns;
};

// Whether ctx's device runs FP8 matmuls (a CUDA device of compute capability 8.9 or newer;
// the CPU's simulation always). When not, *why says so.
bool fp8_available(Context& ctx, std::string* why = nullptr);

// Whether an (M, K) @ (N, K)^T problem fits FP8 tensor cores (kernels/fp8_format.h). The
// CPU simulation applies the same rule, so it quantizes the layers the GPU would.
using kernels::fp8_shape_ok;

// amax (1) f32 = max |x| over x's elements (x contiguous; NaNs skipped).
void fp8_amax(Context& ctx, const Tensor& amax, const Tensor& x);

// Quantizes x (R, C) (bf16/f16/f32 on CUDA, any floating dtype on the CPU) with the scale
// of `amax` (1) f32 (kernels::fp8_scale_for_amax): q.rows when `rows`, q.columns when
// `columns`. With `add_column_sums` (C) defined: add_column_sums += the sums over the rows
// of x (unscaled), from the same read of x (a bias gradient beside the output gradient's
// quantization); deterministic, as ops::bias_backward. With `record_amax` (1) f32 defined:
// record_amax = max(record_amax, max |x|), from the same read (delayed scaling's step amax).
Fp8Quantized fp8_quantize(Context& ctx, const Tensor& x, const Tensor& amax, Fp8Format format,
                          bool rows, bool columns, const Tensor& add_column_sums = Tensor(),
                          const Tensor& record_amax = Tensor());

// fp8_amax and fp8_quantize of values computed from an activation's tensors (kind, see
// kernels/fp8_format.h): swiglu, the activation silu(gate) * up (R, F) of x (R, 2F), dout
// undefined; gelu_grad and swiglu_grad, the gradient at the activation's input from dout,
// the gradient at its output, and x, its input (GELU: (R, C) both; SwiGLU: dout (R, F), x (R,
// 2F)). Each value is rounded to x's dtype as ops::swiglu_forward, gelu_backward or
// swiglu_backward store it: the same amax, bytes, column sums and recorded amax as that op
// followed by fp8_amax / fp8_quantize of its result, which is never stored (on CUDA one read
// of the activation's tensors instead of the op's pass and the cast's read of its result).
void fp8_amax_activation(Context& ctx, const Tensor& amax, Fp8CastSource kind, const Tensor& dout,
                         const Tensor& x);
Fp8Quantized fp8_quantize_activation(Context& ctx, Fp8CastSource kind, const Tensor& dout,
                                     const Tensor& x, const Tensor& amax, Fp8Format format,
                                     bool rows, bool columns,
                                     const Tensor& add_column_sums = Tensor(),
                                     const Tensor& record_amax = Tensor());

// Quantizes the elements of x (contiguous, any shape) into q (u8, as many elements,
// contiguous) with the scale of `amax` (1) f32, element by element as fp8_quantize does: the
// FP8 bytes of a flat piece of a weight (FSDP's FP8 weight shards). Empty x: nothing.
void fp8_quantize_flat(Context& ctx, const Tensor& q, const Tensor& x, const Tensor& amax,
                       Fp8Format format);

// scale_inv (n) f32 = 1 / fp8_scale_for_amax(amax (n) f32), element by element: the inverse
// scales fp8_quantize writes, for operands quantized by fp8_quantize_flat.
void fp8_scale_inverses(Context& ctx, const Tensor& scale_inv, const Tensor& amax, Fp8Format format);

// Quantizes x (R, C) (bf16/f16/f32 on CUDA, any floating dtype on the CPU) block-wise
// (kernels/fp8_format.h), each block scaled by its own amax: q.rows (R, C) with blocks along
// C, q.columns (C, R) with blocks along R (the product reading it has the rows as K).
// block_1x128: activations and output gradients (rows and columns then hold different
// blocks); block_128x128: weights (the same blocks, transposed). Both layouts come from one
// read of x. With `add_column_sums` (C) defined: add_column_sums += the sums over the rows of
// x (unscaled), from the same read of x on CUDA (a bias gradient); deterministic.
Fp8Quantized fp8_quantize_blocks(Context& ctx, const Tensor& x, Fp8Format format,
                                 Fp8Granularity granularity, bool rows, bool columns,
                                 const Tensor& add_column_sums = Tensor());

// Row scaling (the rowwise recipe; kernels/fp8_format.h), in two steps so that a caller can
// take each amax over the ranks that hold other parts of a row or a column before the cast:
// fp8_row_amax: amax (R) f32 = max |x| over each row of x (R, C); fp8_column_amax: amax (C)
// over each column (x contiguous; NaNs skipped).
void fp8_row_amax(Context& ctx, const Tensor& amax, const Tensor& x);
void fp8_column_amax(Context& ctx, const Tensor& amax, const Tensor& x);

// Quantizes x (R, C) row-wise: q.rows (R, C) with each row r scaled by the scale of
// row_amax[r] (R), when row_amax is defined; q.columns (C, R) with each of its rows (x's
// column c) scaled by that of column_amax[c] (C), when column_amax is defined (granularity
// row: one inverse scale per row of each layout). add_column_sums as fp8_quantize's.
Fp8Quantized fp8_quantize_rowwise(Context& ctx, const Tensor& x, Fp8Format format,
                                  const Tensor& row_amax, const Tensor& column_amax,
                                  const Tensor& add_column_sums = Tensor());

// Delayed scaling after a step: history (L, len, W), step_amax and scale_amax (L, W), f32
// and contiguous, for L layers of W operands. Each operand's history takes its step amax as
// the newest entry (entry 0; roll false leaves the history as it is), and scale_amax gets
// the amax its next quantization scales by: the newest entry, or the history's maximum
// with use_max, times margin_factor (kernels::fp8_update_amax_history).
void fp8_update_amax_histories(Context& ctx, const Tensor& history, const Tensor& step_amax,
                               const Tensor& scale_amax, bool roll, bool use_max,
                               float margin_factor);

// out (M, N) = alpha * a (M, K) @ b (N, K)^T + beta * out [+ bias (N)] [Gelu: aux receives
// the pre-activation | DGelu: times gelu'(aux)], a and b dequantized; not both e5m2. out,
// bias and aux: bf16 or f32 on CUDA, f32 or f64 on the CPU. fast_accum: Hopper's faster
// accumulation (for forward products, as Transformer Engine uses it); no effect on the CPU.
// Block-scaled operands (1x128 or 128x128) are both block-scaled, not both 128x128 (as
// cuBLASLt takes them), K a multiple of 128, and without fast_accum (cuBLASLt's block-scaled
// kernels promote every block of K to f32 anyway). Row-scaled operands are both row-scaled,
// without fast_accum.
void fp8_matmul(Context& ctx, const Tensor& out, const Fp8Matrix& a, const Fp8Matrix& b,
                double alpha = 1.0, double beta = 0.0, const Tensor& bias = Tensor(),
                Epilogue epilogue = Epilogue::None, const Tensor& aux = Tensor(),
                bool fast_accum = false);

}  // namespace fsdp::ops
