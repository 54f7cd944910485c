// CPU matmul. The products come from OpenBLAS (Debian's libopenblas-openmp-dev, its OpenMP
// build): on the CPU quickstart's shapes it computes the products 2.3-3.5 times as fast as the
// hand-written kernel below (docs/PERFORMANCE.md, "OpenBLAS for the CPU matmuls"). That kernel
// (cache-blocked, packed panels, a register-tiled inner kernel vectorized with GCC vector
// extensions, an AVX2 clone picked at run time) stays: it is the fallback where the loaded
// OpenBLAS is not the OpenMP build, a size does not fit BLAS's 32-bit integers or K is 0, and
// the tests' reference.
//
// Both spread fixed tiles of the output over OpenMP threads and compute each tile whole on
// one thread, each OpenBLAS call on the calling thread alone: an element's value depends on
// the problem's shape only, never on the number of threads (OpenBLAS's own threading would
// split the output by thread count, and its kernels round an element differently by where it
// falls in their register blocks), so the losses stay bitwise the same for any number of
// ranks. The epilogue (alpha, beta, bias, GELU) is ours in both, in double, one rounding.
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

// The same with the hand-written kernel only (the fallback; tests compare the two).
void blocked_matmul(const MatmulDims& dims, void* out, DType out_dtype, const void* a,
                    const void* b, DType in_dtype, double alpha, double beta, const void* bias,
                    void* aux, MatmulEpilogue epilogue);

// Whether matmul's products come from OpenBLAS in this process (its OpenMP build is loaded).
bool matmul_uses_openblas();

// dbias (n) (+)= column sums of dout (m, n) (compute dtype), in the grad dtype; summed in
// double, row by row.
void bias_backward(void* dbias, DType grad_dtype, const void* dout, DType dtype, int64_t m,
                   int64_t n, bool accumulate);

}  // namespace fsdp::kernels::cpu
