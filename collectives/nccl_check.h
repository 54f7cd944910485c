// check_call() overload for NCCL's ncclResult_t (see FSDP_CALL in runtime/core/error.h).
//
// Only translation units compiled by nvcc include nccl.h (and so this header): nccl.h pulls
// in cuda_fp16.h and its extension-less <nv/target>, which nvcc finds in its own toolkit
// and the host compiler's sandboxed include path does not have.
#pragma once

#include <nccl.h>

#include <string>

#include "runtime/core/error.h"

namespace fsdp {

inline void check_call(ncclResult_t status, const char* expr, const char* file, int line) {
  if (status == ncclSuccess) return;
  // ncclGetLastError holds the detailed reason NCCL logged for the most recent failure.
  const char* detail = ncclGetLastError(nullptr);
  throw CommError(str_cat(expr, " failed: ", ncclGetErrorString(status),
                          (detail && *detail) ? str_cat(" (", detail, ")") : std::string(),
                          " at ", file, ":", line));
}

}  // namespace fsdp
