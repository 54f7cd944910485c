#include "runtime/core/stream.h"

#include <unistd.h>

#include <chrono>
#include <thread>

#include "runtime/core/error.h"

#if FSDP_WITH_CUDA
#include "runtime/core/cuda_check.h"
#endif

namespace fsdp {

namespace {

size_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  FSDP_CHECK(pages > 0 && page > 0, DeviceError, "cannot read the host's physical memory size");
  return size_t(pages) * size_t(page);
}

size_t host_free_bytes() {
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  FSDP_CHECK(pages >= 0 && page > 0, DeviceError, "cannot read the host's free memory");
  return size_t(pages) * size_t(page);
}

}  // namespace

#if FSDP_WITH_CUDA

namespace {

struct GpuMemory {
  size_t free = 0, total = 0;
};

GpuMemory gpu_memory(Device device) {
  DeviceGuard guard(device);
  GpuMemory m;
  FSDP_CALL(cudaMemGetInfo(&m.free, &m.total));
  return m;
}

}  // namespace

size_t device_memory_bytes(Device device) {
  return device.is_cpu() ? host_memory_bytes() : gpu_memory(device).total;
}

size_t device_memory_free_bytes(Device device) {
  return device.is_cpu() ? host_free_bytes() : gpu_memory(device).free;
}

bool cuda_built() { return true; }

int cuda_device_count() {
  int n = 0;
  // No driver or no device is not an error here: it means "no GPU".
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky status so later calls are not confused
    return 0;
  }
  return n;
}

Stream Stream::create_cuda(int device, int priority) {
  DeviceGuard guard(Device::cuda(device));
  cudaStream_t s = nullptr;
  FSDP_CALL(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority));
  Stream out;
  out.device_ = Device::cuda(device);
  out.raw_ = s;
  out.owner_ = std::shared_ptr<void>(s, [device](void* p) {
    // Destroying a stream is safe with work still queued; errors here cannot be
    // reported (destructor path) and leave nothing to recover.
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(device);
    cudaStreamDestroy(static_cast<cudaStream_t>(p));
    cudaSetDevice(prev);
  });
  return out;
}

Stream Stream::wrap_cuda(int device, CUstream_st* stream) {
  Stream out;
  out.device_ = Device::cuda(device);
  out.raw_ = stream;
  return out;
}

CUstream_st* Stream::cuda_stream() const {
  FSDP_CHECK(device_.is_cuda(), DeviceError, "cuda_stream() called on a CPU stream");
  return raw_;
}

namespace {

// Waits for `event` by polling. A thread blocked inside the driver (cudaStreamSynchronize,
// cudaEventSynchronize, a copy into pageable memory) can hold up other threads' CUDA calls;
// the collective watchdog's event queries must never wait behind a main thread that waits
// for a collective that will not finish, or the hang could not be reported.
void poll_until_done(cudaEvent_t event) {
  for (int spins = 0;; ++spins) {
    const cudaError_t st = cudaEventQuery(event);
    if (st != cudaErrorNotReady) {
      FSDP_CALL(st);
      return;
    }
    if (spins < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

}  // namespace

void Stream::synchronize() const {
  if (!device_.is_cuda()) return;
  DeviceGuard guard(device_);
  cudaEvent_t event = nullptr;
  FSDP_CALL(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  cudaError_t st = cudaEventRecord(event, raw_);
  if (st == cudaSuccess) {
    try {
      poll_until_done(event);
    } catch (...) {
      cudaEventDestroy(event);
      throw;
    }
  }
  cudaEventDestroy(event);
  FSDP_CALL(st);
}

void Stream::wait(const Event& event) const {
  if (!device_.is_cuda() || !event.recorded() || !event.device().is_cuda()) return;
  FSDP_CALL(cudaStreamWaitEvent(raw_, event.cuda_event(), 0));
}

bool Stream::query() const {
  if (!device_.is_cuda()) return true;
  cudaError_t st = cudaStreamQuery(raw_);
  if (st == cudaErrorNotReady) return false;
  FSDP_CALL(st);
  return true;
}

Event Event::create(Device device, bool enable_timing) {
  Event e;
  e.device_ = device;
  e.timing_ = enable_timing;
  if (!device.is_cuda()) return e;
  DeviceGuard guard(device);
  cudaEvent_t ev = nullptr;
  FSDP_CALL(cudaEventCreateWithFlags(&ev, enable_timing ? cudaEventDefault : cudaEventDisableTiming));
  e.raw_ = ev;
  e.owner_ = std::shared_ptr<void>(ev, [](void* p) { cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
  return e;
}

void Event::record(const Stream& stream) {
  if (stream.is_cuda()) {
    if (!raw_) *this = Event::create(stream.device(), false);
    FSDP_CHECK(device_ == stream.device(), DeviceError, "event of ", device_.str(),
               " recorded on a stream of ", stream.device().str());
    FSDP_CALL(cudaEventRecord(raw_, stream.cuda_stream()));
  }
  recorded_ = true;
}

void Event::synchronize() const {
  if (!raw_ || !recorded_) return;
  DeviceGuard guard(device_);
  poll_until_done(raw_);
}

bool Event::query() const {
  if (!raw_ || !recorded_) return true;
  cudaError_t st = cudaEventQuery(raw_);
  if (st == cudaErrorNotReady) return false;
  FSDP_CALL(st);
  return true;
}

float Event::elapsed_ms(const Event& start, const Event& end) {
  FSDP_CHECK(start.raw_ && end.raw_ && start.timing_ && end.timing_, ValueError,
             "elapsed_ms needs two CUDA events created with enable_timing");
  float ms = 0;
  FSDP_CALL(cudaEventElapsedTime(&ms, start.raw_, end.raw_));
  return ms;
}

DeviceGuard::DeviceGuard(Device device) {
  if (!device.is_cuda()) return;
  FSDP_CALL(cudaGetDevice(&previous_));
  if (previous_ != device.index) FSDP_CALL(cudaSetDevice(device.index));
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);  // destructor: nothing to report to
}

#else  // CPU-only build

bool cuda_built() { return false; }
int cuda_device_count() { return 0; }

size_t device_memory_bytes(Device device) {
  FSDP_CHECK(device.is_cpu(), DeviceError, "device_memory_bytes(", device.str(),
             "): this build has no CUDA support");
  return host_memory_bytes();
}

size_t device_memory_free_bytes(Device device) {
  FSDP_CHECK(device.is_cpu(), DeviceError, "device_memory_free_bytes(", device.str(),
             "): this build has no CUDA support");
  return host_free_bytes();
}

Stream Stream::create_cuda(int, int) {
  FSDP_THROW(DeviceError, "CUDA stream requested, but this build has no CUDA support (--config=cpu)");
}
Stream Stream::wrap_cuda(int, CUstream_st*) {
  FSDP_THROW(DeviceError, "CUDA stream requested, but this build has no CUDA support (--config=cpu)");
}
CUstream_st* Stream::cuda_stream() const {
  FSDP_THROW(DeviceError, "cuda_stream() called on a CPU stream");
}
void Stream::synchronize() const {}
void Stream::wait(const Event&) const {}
bool Stream::query() const { return true; }

Event Event::create(Device device, bool enable_timing) {
  FSDP_CHECK(device.is_cpu(), DeviceError, "CUDA event requested, but this build has no CUDA support");
  Event e;
  e.timing_ = enable_timing;
  return e;
}
void Event::record(const Stream&) { recorded_ = true; }
void Event::synchronize() const {}
bool Event::query() const { return true; }
float Event::elapsed_ms(const Event&, const Event&) {
  FSDP_THROW(ValueError, "elapsed_ms needs CUDA events; this build has no CUDA support");
}

DeviceGuard::DeviceGuard(Device device) {
  FSDP_CHECK(device.is_cpu(), DeviceError, "device ", device.str(),
             " requested, but this build has no CUDA support (--config=cpu)");
}
DeviceGuard::~DeviceGuard() {}

#endif

}  // namespace fsdp
