// CPU matmul: cache-blocked, packed panels, a register-tiled inner kernel vectorized with
// GCC vector extensions (an AVX2 clone is picked at run time where the CPU has it), tiles of
// the output spread over OpenMP threads.
//
// Deterministic: each output element is summed in the same order (K in fixed blocks, each
// block in index order) whatever the number of threads or the instruction set.
#pragma once

#include "kernels/nn_shapes.h"
#include "runtime/core/dtype.h"

namespace fsdp::kernels::cpu {

// out = alpha * op(a) @ op(b) + beta * out [+ bias (N)], then the epilogue: Gelu stores
// that pre-activation in aux (when given) and out = gelu(aux); DGelu multiplies by
// gelu'(aux) (aux read). a and b share `in_dtype` (f32 or f64); out, bias and aux share
// `out_dtype` (f32 or f64, at least as wide). Products are accumulated in the input type;
// the epilogue is computed in double. beta == 0 never reads out.
void matmul(const MatmulDims& dims, void* out, DType out_dtype, const void* a, const void* b,
            DType in_dtype, double alpha, double beta, const void* bias, void* aux,
            MatmulEpilogue epilogue);

// dbias (n) (+)= column sums of dout (m, n) (compute dtype), in the grad dtype; summed in
// double, row by row.
void bias_backward(void* dbias, DType grad_dtype, const void* dout, DType dtype, int64_t m,
                   int64_t n, bool accumulate);

}  // namespace fsdp::kernels::cpu
