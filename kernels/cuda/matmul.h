// cuBLASLt matmuls for one CUDA context: the handle, a 64 MiB workspace, and one plan
// (descriptors and the heuristic's algorithm) cached per problem shape. A Context
// extension: ctx.extension<kernels::cuda::Blas>().
//
// Row-major problems map onto cuBLASLt's column-major convention by swapping operands: the
// row-major (M, N) output is the column-major (N, M) matrix out^T = op(b)^T op(a)^T, so
// cuBLASLt is called with A := b, B := a and m := N, n := M. The bias of length N is then
// cuBLASLt's per-row bias, as its epilogues expect.
#pragma once

#include <memory>

#include "kernels/nn_shapes.h"
#include "runtime/core/context.h"

namespace fsdp::kernels::cuda {

class Blas {
 public:
  explicit Blas(Context& ctx);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // As kernels::cpu::matmul, on ctx's current stream. Inputs bf16 or f32; out the input
  // dtype, or f32 for bf16 inputs (beta = 1 accumulates weight gradients in f32). bias and
  // aux have the output dtype. f32 accumulation always.
  void matmul(const MatmulDims& dims, void* out, DType out_dtype, const void* a, const void* b,
              DType in_dtype, double alpha, double beta, const void* bias, void* aux,
              MatmulEpilogue epilogue);

  // With MatmulEpilogue::BiasGrad, `aux` (M floats) receives the sums over K of op(a).
  // Returns false, having done nothing, when cuBLASLt has no algorithm for that epilogue
  // with this problem (the caller sums the bias gradient itself); true otherwise.
  bool try_matmul(const MatmulDims& dims, void* out, DType out_dtype, const void* a,
                  const void* b, DType in_dtype, double alpha, double beta, const void* bias,
                  void* aux, MatmulEpilogue epilogue);

  // FP8 (Hopper's tensor cores, compute capability 8.9+): out (M, N) = alpha * a_scale *
  // b_scale * a (M, K) @ b (N, K)^T + beta * out (+ bias) then the epilogue (None, or Gelu
  // with aux receiving the pre-activation), f32 accumulation. a and b are f8e4m3 or f8e5m2
  // (not both f8e5m2) with K contiguous in both: dims.trans_a false and dims.trans_b true,
  // cuBLASLt's only FP8 layout ("TN"). a_scale / b_scale are device pointers to one f32 each
  // (the operands' scale_inv: what undoes their quantization), read when the matmul runs.
  // out is bf16 or f32 (beta = 1 accumulates weight gradients); bias bf16 beside a bf16 out.
  // M, N and K must be multiples of 16. Returns false, having done nothing, when cuBLASLt
  // has no FP8 algorithm with that bias or epilogue for the problem (the caller applies them
  // itself after a plain product); throws when it has none for the plain product.
  bool fp8_matmul(const MatmulDims& dims, void* out, DType out_dtype, const void* a,
                  DType a_dtype, const float* a_scale, const void* b, DType b_dtype,
                  const float* b_scale, double alpha, double beta, const void* bias, void* aux,
                  MatmulEpilogue epilogue);

  // Number of problem shapes whose plans are cached (for tests of the cache). The cache
  // keeps at most kMaxCachedPlans: the experts of a mixture-of-experts layer get new row
  // counts every step, so their shapes never stop coming; the least recently used half
  // goes when it is full.
  size_t cached_plans() const;
  static constexpr size_t kMaxCachedPlans = 1024;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::kernels::cuda
