// NvtxRange: a named range on the NVTX timeline (Nsight Systems) for the lifetime of the
// object; nothing in CPU-only builds. NVTX v3 is header-only, so this costs no library.
#pragma once

#if FSDP_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
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

}  // namespace fsdp
