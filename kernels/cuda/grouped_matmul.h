// Expert-grouped matmuls in one cuBLAS grouped-GEMM call (cublasGemmGroupedBatchedEx): the
// experts of a mixture-of-experts layer each multiply their own rows by their own weight,
// and one launch schedules every expert's tiles together, so experts with few rows still
// fill the GPU (one cuBLASLt call per expert leaves most SMs idle when an expert's output
// is a few tiles, and plans a new problem whenever its row count changes). A Context
// extension: ctx.extension<kernels::cuda::GroupedBlas>().
//
// Row-major problems as in blas.h: the row-major (M, N) output is the column-major (N, M)
// matrix out^T = op(b)^T op(a)^T.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/nn_shapes.h"
#include "runtime/core/context.h"

namespace fsdp::kernels::cuda {

// The experts' problems: x holds `rows[e]` consecutive rows of expert e, in expert order;
// w (E, F, K) one weight per expert.
struct GroupedMatmulDims {
  std::vector<int64_t> rows;  // (E) host
  int64_t F = 0, K = 0;
  DType dtype = DType::bf16;  // x, w, y, dy, dx
  // Experts with more rows are skipped (left to the caller): they fill the GPU alone.
  int64_t max_rows = INT64_MAX;
};

class GroupedBlas {
 public:
  explicit GroupedBlas(Context& ctx);
  ~GroupedBlas();
  GroupedBlas(const GroupedBlas&) = delete;
  GroupedBlas& operator=(const GroupedBlas&) = delete;

  // Each returns false, having done nothing, when cuBLAS has no grouped GEMM for these
  // dtypes (CUBLAS_STATUS_NOT_SUPPORTED: the caller runs one matmul per expert); experts
  // without rows are skipped (their weight gradient is left as it is).
  // y_e (rows_e, F) = x_e (rows_e, K) @ w_e^T
  bool forward(const GroupedMatmulDims& d, void* y, const void* x, const void* w);
  // dx_e (rows_e, K) = dy_e (rows_e, F) @ w_e
  bool input_grad(const GroupedMatmulDims& d, void* dx, const void* dy, const void* w);
  // dw_e (F, K) = dy_e^T @ x_e + beta dw_e; dw of dw_dtype (the inputs' dtype or f32).
  bool weight_grad(const GroupedMatmulDims& d, void* dw, DType dw_dtype, const void* dy,
                   const void* x, double beta);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::kernels::cuda
