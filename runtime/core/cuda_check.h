// check_call() overload for the CUDA runtime's cudaError_t (see FSDP_CALL in error.h).
// Only code compiled with CUDA includes this header.
#pragma once

#include <cuda_runtime.h>

#include "runtime/core/error.h"

namespace fsdp {

inline void check_call(cudaError_t status, const char* expr, const char* file, int line) {
  if (status == cudaSuccess) return;
  const std::string msg = str_cat(expr, " failed: ", cudaGetErrorName(status), " (",
                                  cudaGetErrorString(status), ") at ", file, ":", line);
  if (status == cudaErrorMemoryAllocation) throw OutOfMemoryError(msg);
  throw CudaError(msg);
}

}  // namespace fsdp
