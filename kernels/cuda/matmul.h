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
