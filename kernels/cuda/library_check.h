// check_call() overloads for cuBLAS(Lt) and cuDNN status codes (see FSDP_CALL in
// runtime/core/error.h). Host code only.
#pragma once

#include <cublasLt.h>
#include <cudnn.h>

#include "runtime/core/cuda_check.h"
#include "runtime/core/error.h"

namespace fsdp {

inline void check_call(cublasStatus_t status, const char* expr, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  const std::string msg = str_cat(expr, " failed: ", cublasLtGetStatusName(status), " (",
                                  cublasLtGetStatusString(status), ") at ", file, ":", line);
  if (status == CUBLAS_STATUS_ALLOC_FAILED) throw OutOfMemoryError(msg);
  throw CudaError(msg);
}

inline void check_call(cudnnStatus_t status, const char* expr, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  char detail[512] = {};
  cudnnGetLastErrorString(detail, sizeof(detail));
  const std::string msg = str_cat(expr, " failed: ", cudnnGetErrorString(status), " [", detail,
                                  "] at ", file, ":", line);
  throw CudaError(msg);
}

}  // namespace fsdp
