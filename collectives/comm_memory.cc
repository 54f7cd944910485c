#include "collectives/comm_memory.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "runtime/core/log.h"

#if FSDP_WITH_CUDA
#include "collectives/nccl_communicator.h"
#include "runtime/core/cuda_check.h"
#endif

namespace fsdp {

size_t registrable_bytes(size_t bytes) {
  const size_t g = kRegistrableGranularity;
  return (std::max<size_t>(bytes, 1) + g - 1) / g * g;
}

Tensor zeros_registrable(Context& ctx, int64_t numel, DType dtype, const std::string& what) {
  FSDP_CHECK(numel >= 0, ValueError, "buffer ", what, ": negative size ", numel);
  const size_t bytes = registrable_bytes(size_t(numel) * dtype_size(dtype));
  const int64_t n = std::max<int64_t>(numel, 1);
  if (!ctx.is_cuda()) {
    // The whole granule, so that the host allocator's size class (a multiple of 2 MiB is
    // its own class) equals what the GPU path reports.
    Tensor t = ctx.empty(Shape{int64_t(bytes)}, DType::u8);
    std::memset(t.data_ptr(), 0, bytes);
    return Tensor::from_storage(t.storage(), Shape{n}, dtype);
  }
#if FSDP_WITH_CUDA
  const Device device = ctx.device();
  void* data = nccl_mem_alloc(device, bytes, what);
  std::shared_ptr<void> owner(data, [device, what](void* p) {
    const std::string error = nccl_mem_free(device, p);
    if (!error.empty())
      Logger(0, LogLevel::Info, stderr).warn("freeing ", what, " on ", device.str(), ": ", error);
  });
  Tensor t = Tensor::from_storage(Storage::wrap(data, bytes, device, std::move(owner)), Shape{n},
                                  dtype);
  // Zeroed in stream order with the work that follows on the context's stream.
  FSDP_CALL(cudaMemsetAsync(data, 0, bytes, ctx.stream().cuda_stream()));
  return t;
#else
  FSDP_THROW(DeviceError, "buffer ", what, ": ", ctx.device().str(),
             " in a build without CUDA (--config=cpu)");
#endif
}

}  // namespace fsdp
