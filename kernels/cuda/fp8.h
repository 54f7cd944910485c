// CUDA kernels of FP8 tensor-wise quantization, and FP8 matmuls on cuBLASLt (the twins of
// kernels/cpu/fp8.h). Raw pointers, sizes and a stream; nothing synchronizes with the host:
// the scale goes from the amax on the device to the quantize kernel and the matmul without a
// round trip.
#pragma once

#include <cstdint>

#include "kernels/cuda/basic.h"
#include "kernels/cuda/column_sum.h"
#include "kernels/cuda/matmul.h"
#include "kernels/fp8_format.h"

namespace fsdp::kernels::cuda {

// The compute capability of a device as major * 10 + minor (90 for Hopper); FP8 tensor
// cores need 89 or more.
int compute_capability(int device);

// *amax (f32 on the device) = max |x| over n elements of x (bf16, f16 or f32).
void fp8_amax(float* amax, const void* x, DType dtype, int64_t n, stream_t stream);

// q (rows, cols) = fp8(x * scale) and, when qt is not null, qt (cols, rows) its transpose,
// scale = fp8_scale_for_amax(*amax); *scale_inv = 1 / scale. Either of q and qt may be null.
// With column_sums.out: column_sums.out += the column sums of x, from the same read (a bias
// gradient), through partials of (fp8_column_sum_tiles(rows), cols) f32. When record_amax is
// not null, *record_amax = max(*record_amax, max |x|)
// (delayed scaling's step amax, from the same read; an integer atomicMax of the bits, so
// the result does not depend on the order).
int64_t fp8_column_sum_tiles(int64_t rows);
void fp8_quantize(const void* x, DType dtype, int64_t rows, int64_t cols, const float* amax,
                  Fp8Format format, uint8_t* q, uint8_t* qt, float* scale_inv,
                  const ColumnSums& column_sums, float* record_amax, stream_t stream);

// fp8_amax and fp8_quantize of a cast source's values (kernels/fp8_format.h) of (rows,
// cols): x itself (dout null), or computed from an activation's x (and dout) as they are
// read, never stored: the same amax, bytes, sums and recorded amax as the cast of what
// swiglu_forward, gelu_backward or swiglu_backward store (activation.h), from one read.
void fp8_amax(float* amax, const void* x, const void* dout, Fp8CastSource source, DType dtype,
              int64_t rows, int64_t cols, stream_t stream);
void fp8_quantize(const void* x, const void* dout, Fp8CastSource source, DType dtype,
                  int64_t rows, int64_t cols, const float* amax, Fp8Format format, uint8_t* q,
                  uint8_t* qt, float* scale_inv, const ColumnSums& column_sums,
                  float* record_amax, stream_t stream);
// q (n) = fp8_quantize's bytes of n contiguous elements of x, element by element (a flat
// piece of a weight, FSDP's FP8 weight shards); *scale_inv (f32 on the device) receives the
// inverse scale, which the shards' users take from fp8_scale_inverses instead.
void fp8_quantize_flat(const void* x, DType dtype, int64_t n, const float* amax,
                       Fp8Format format, uint8_t* q, float* scale_inv, stream_t stream);

// scale_inv[i] = 1 / fp8_scale_for_amax(amax[i]) for n amaxes, f32 on the device (the twin
// of cpu::fp8_scale_inverses; the same bits as fp8_quantize's *scale_inv).
void fp8_scale_inverses(const float* amax, int64_t n, Fp8Format format, float* scale_inv,
                        stream_t stream);

// Delayed scaling after a step (the twin of cpu::fp8_update_amax_histories): history
// (layers, len, width), step_amax and scale_amax (layers, width), f32 on the device.
void fp8_update_amax_histories(float* history, const float* step_amax, float* scale_amax,
                               int64_t layers, int64_t len, int64_t width, bool roll,
                               bool use_max, float margin_factor, stream_t stream);

// The FP8 product of kernels/fp8.h's fp8_matmul on cuBLASLt (the twin of cpu::fp8_matmul):
// out (M, N) = alpha * a (M, K) @ b (N, K)^T + beta * out [+ bias] [epilogue], a and b FP8
// bytes with their inverse scales (one f32 each, on the device); out, bias and aux bf16 or
// f32 (the output's dtype). Where cuBLASLt's FP8 kernels lack the epilogue or the output,
// the plain FP8 product runs and our GELU kernels or an axpby finish it (in scratch where
// they need it). Throws when cuBLASLt has no FP8 algorithm for the problem at all.
void fp8_matmul(Blas& blas, int64_t m, int64_t n, int64_t k, void* out, DType out_dtype,
                const uint8_t* a, Fp8Format format_a, const float* scale_inv_a, const uint8_t* b,
                Fp8Format format_b, const float* scale_inv_b, double alpha, double beta,
                const void* bias, void* aux, MatmulEpilogue epilogue, bool fast_accum,
                const Scratch& scratch, stream_t stream);
// The block- or row-scaled product (the twin of cpu::fp8_matmul_blocks; both operands
// block-scaled, not both 128x128, or both row-scaled): cuBLASLt's block-scaled (VEC128,
// BLK128x128) or outer-vector (OUTER_VEC) kernels for the plain product and its bias, our
// kernels for GELU, its gradient and a bias cuBLASLt declines. Throws when cuBLASLt has no
// algorithm for the problem.
void fp8_matmul_blocks(Blas& blas, int64_t m, int64_t n, int64_t k, void* out, DType out_dtype,
                       const uint8_t* a, Fp8Format format_a, Fp8Granularity ga, const float* sa,
                       const uint8_t* b, Fp8Format format_b, Fp8Granularity gb, const float* sb,
                       double alpha, double beta, const void* bias, void* aux,
                       MatmulEpilogue epilogue, const Scratch& scratch, stream_t stream);

// alpha_beta[0] = alpha * (sa * sb) (each product rounded to f32), alpha_beta[1] = beta: the
// device-side scalars of an FP8 matmul.
void fp8_matmul_scalars(float* alpha_beta, const float* scale_inv_a, const float* scale_inv_b,
                        float alpha, float beta, stream_t stream);

}  // namespace fsdp::kernels::cuda
