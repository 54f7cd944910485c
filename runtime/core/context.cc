#include "runtime/core/context.h"

#if FSDP_WITH_CUDA
#include "runtime/core/cuda_check.h"
#endif

namespace fsdp {

Context::Context(Device device) : device_(device) {
  host_allocator_ = std::make_shared<HostAllocator>();
  if (device.is_cuda()) {
    make_current();
    allocator_ = std::make_shared<CudaCachingAllocator>(device.index);
    compute_stream_ = Stream::create_cuda(device.index);
  } else {
    allocator_ = host_allocator_;
  }
  stream_ = compute_stream_;
}

Context::~Context() {
  // Extensions may hold tensors and handles bound to the stream: drop them first, newest
  // first, after the queued work is done.
  try {
    compute_stream_.synchronize();
  } catch (...) {
    // A failed device cannot be waited on; tear down regardless.
  }
  while (!extension_order_.empty()) extension_order_.pop_back();
  extensions_.clear();
}

void Context::make_current() const {
  if (!device_.is_cuda()) return;
#if FSDP_WITH_CUDA
  FSDP_CALL(cudaSetDevice(device_.index));
#endif
}

const std::shared_ptr<Allocator>& Context::pinned_allocator() const {
  if (!pinned_allocator_) {
    if (device_.is_cuda())
      pinned_allocator_ = std::make_shared<PinnedHostAllocator>();
    else
      pinned_allocator_ = host_allocator_;  // on a CPU context all host memory is "pinned"
  }
  return pinned_allocator_;
}

Tensor Context::empty(const Shape& shape, DType dtype) const {
  return Tensor::empty(shape, dtype, allocator_, stream_);
}

Tensor Context::empty_host(const Shape& shape, DType dtype) const {
  return Tensor::empty(shape, dtype, host_allocator_, Stream());
}

Tensor Context::empty_pinned(const Shape& shape, DType dtype) const {
  return Tensor::empty(shape, dtype, pinned_allocator(), Stream());
}

}  // namespace fsdp
