// Streams and events: ordered queues of device work and markers in them.
//
// On the CPU every operation runs inline when it is issued, so a CPU stream is an empty
// handle and a CPU event is complete as soon as it is recorded. On CUDA they wrap
// cudaStream_t / cudaEvent_t. Code above this layer is written once against these types
// and runs on both backends.
#pragma once

#include <memory>

#include "runtime/core/device.h"

// Forward declarations of the CUDA runtime's opaque handle types, so that this header
// does not pull in cuda_runtime.h.
struct CUstream_st;
struct CUevent_st;

namespace fsdp {

class Event;

class Stream {
 public:
  // The inline CPU stream.
  Stream() = default;
  static Stream cpu() { return Stream(); }
  // A new CUDA stream on `device` (owned; destroyed with the last copy of this handle).
  // Higher priority streams (priority < 0) are scheduled first; collectives use them.
  static Stream create_cuda(int device, int priority = 0);
  // Wraps an existing CUDA stream without owning it (nullptr is the legacy default stream).
  static Stream wrap_cuda(int device, CUstream_st* stream);

  Device device() const { return device_; }
  bool is_cuda() const { return device_.is_cuda(); }
  CUstream_st* cuda_stream() const;  // throws DeviceError for a CPU stream

  void synchronize() const;           // block the host until all queued work is done
  void wait(const Event& event) const;  // later work on this stream waits for `event`
  bool query() const;                 // true when all queued work is done

  bool operator==(const Stream& o) const {
    return device_ == o.device_ && raw_ == o.raw_;
  }
  bool operator!=(const Stream& o) const { return !(*this == o); }

 private:
  Device device_ = Device::cpu();
  CUstream_st* raw_ = nullptr;
  std::shared_ptr<void> owner_;  // destroys raw_ when the last owning handle goes
};

class Event {
 public:
  Event() = default;  // an empty event: waiting on it does nothing; query() is true
  // A CUDA event on `device`; timing events can measure elapsed time between two records.
  static Event create(Device device, bool enable_timing = false);

  void record(const Stream& stream);  // marks the current end of `stream`'s queue
  // A new event marking the current end of `stream`'s queue.
  static Event at_end_of(const Stream& stream) {
    Event e;
    e.record(stream);
    return e;
  }
  void synchronize() const;           // block the host until the marked work is done
  bool query() const;                 // true when the marked work is done
  // Milliseconds between two recorded timing events (both must have completed).
  static float elapsed_ms(const Event& start, const Event& end);

  bool recorded() const { return recorded_; }
  Device device() const { return device_; }
  CUevent_st* cuda_event() const { return raw_; }

 private:
  Device device_ = Device::cpu();
  CUevent_st* raw_ = nullptr;
  std::shared_ptr<void> owner_;
  bool recorded_ = false;
  bool timing_ = false;
};

// Makes `device` the current CUDA device for the lifetime of the guard (no-op on CPU).
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace fsdp
