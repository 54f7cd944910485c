// NvtxRange: a named range on the NVTX timeline (Nsight Systems) for the lifetime of the
// object; nothing in CPU-only builds. NVTX v3 is header-only, so this costs no library.
#pragma once

#if FSDP_WITH_CUDA
#include <cuda_profiler_api.h>
#include <nvtx3/nvToolsExt.h>

#include "runtime/core/cuda_check.h"
#endif

namespace fsdp {

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) {
#if FSDP_WITH_CUDA
    nvtxRangePushA(name);
#else
    (void)name;
#endif
  }
  ~NvtxRange() {
#if FSDP_WITH_CUDA
    nvtxRangePop();
#endif
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

// Opens and closes the profiler's capture window (cudaProfilerStart / Stop): a profiler
// started with capture off (`ncu --profile-from-start off`) records only the kernels in
// between. Nothing in CPU-only builds.
inline void profiler_capture(bool on) {
#if FSDP_WITH_CUDA
  if (on)
    FSDP_CALL(cudaProfilerStart());
  else
    FSDP_CALL(cudaProfilerStop());
#else
  (void)on;
#endif
}

}  // namespace fsdp
