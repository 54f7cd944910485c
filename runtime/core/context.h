// Context: everything one rank needs to run work on one device, in one explicit object.
//
// It owns the device's allocator, a host allocator (and a pinned one on CUDA), and the
// compute stream that kernels are issued on. Layers above keep their per-device state
// (cuBLASLt and cuDNN handles, workspaces, plan caches) as *extensions* of the context,
// created on first use, so nothing lives in globals and several contexts can coexist in
// one process (e.g. one per GPU in a test, or an embedding program with its own).
#pragma once

#include <functional>
#include <memory>
#include <typeindex>
#include <unordered_map>

#include "runtime/core/allocator.h"
#include "runtime/core/device.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace fsdp {

class Context {
 public:
  // A CPU context, or a CUDA context for device `device.index` with a new compute stream.
  // A CUDA context makes its device the calling thread's current device: kernels launch on
  // the current device, so a thread works with one CUDA context at a time (as one rank
  // drives one GPU).
  explicit Context(Device device = Device::cpu());
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Device device() const { return device_; }
  bool is_cuda() const { return device_.is_cuda(); }
  // Makes this context's device the calling thread's current CUDA device (no-op on CPU).
  void make_current() const;

  // Memory for tensors on this device / on the host / page-locked on the host.
  const std::shared_ptr<Allocator>& allocator() const { return allocator_; }
  const std::shared_ptr<Allocator>& host_allocator() const { return host_allocator_; }
  const std::shared_ptr<Allocator>& pinned_allocator() const;

  // The stream kernels are issued on now. StreamScope switches it for a while.
  const Stream& stream() const { return stream_; }
  const Stream& compute_stream() const { return compute_stream_; }

  // New uninitialized tensors on this device (or on the host), ordered on stream().
  Tensor empty(const Shape& shape, DType dtype) const;
  Tensor empty_host(const Shape& shape, DType dtype) const;
  // Page-locked host memory (plain host memory on a CPU context): fast, asynchronous copies.
  Tensor empty_pinned(const Shape& shape, DType dtype) const;

  // Block the host until everything queued on the compute stream is done.
  void synchronize() const { compute_stream_.synchronize(); }

  // The extension of type T, created as T(*this) on first use. T's destructor runs before
  // the context's streams and allocators go away.
  template <typename T>
  T& extension() {
    auto it = extensions_.find(std::type_index(typeid(T)));
    if (it == extensions_.end()) {
      auto obj = std::make_shared<T>(*this);
      extension_order_.push_back(obj);
      it = extensions_.emplace(std::type_index(typeid(T)), obj.get()).first;
    }
    return *static_cast<T*>(it->second);
  }

 private:
  friend class StreamScope;
  Device device_;
  std::shared_ptr<Allocator> allocator_;
  std::shared_ptr<Allocator> host_allocator_;
  mutable std::shared_ptr<Allocator> pinned_allocator_;
  Stream compute_stream_;
  Stream stream_;
  std::unordered_map<std::type_index, void*> extensions_;  // owned by extension_order_
  std::vector<std::shared_ptr<void>> extension_order_;  // destroyed in reverse creation order
};

// Issues kernels on `stream` instead of the context's current stream until destroyed.
class StreamScope {
 public:
  StreamScope(Context& ctx, const Stream& stream) : ctx_(ctx), saved_(ctx.stream_) {
    FSDP_CHECK(stream.device() == ctx.device(), DeviceError, "StreamScope: stream of ",
               stream.device().str(), " on a context of ", ctx.device().str());
    ctx.stream_ = stream;
  }
  ~StreamScope() { ctx_.stream_ = saved_; }
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  Context& ctx_;
  Stream saved_;
};

}  // namespace fsdp
