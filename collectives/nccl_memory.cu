// Compiled by nvcc (host code only): see nccl_check.h. NCCL user-buffer registration
// (NcclCommunicator::issue_register) and the memory it needs (nccl_mem_alloc).
#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>

#include "collectives/nccl_check.h"
#include "collectives/nccl_communicator.h"
#include "runtime/core/cuda_check.h"
#include "runtime/core/log.h"

namespace fsdp {
namespace {

// One registration; deregistered on destruction, while the communicator still lives.
class NcclRegisteredBuffer final : public RegisteredBuffer {
 public:
  NcclRegisteredBuffer(std::shared_ptr<NcclCommHandle> handle, std::shared_ptr<NcclShared> shared,
                       int rank, std::string what, void* local_handle, ncclWindow_t window)
      : handle_(std::move(handle)), shared_(std::move(shared)), rank_(rank),
        what_(std::move(what)), local_(local_handle), window_(window) {}

  ~NcclRegisteredBuffer() override {
    // A destructor cannot throw: a failed deregistration is reported, and changes nothing
    // for the caller (the communicator frees what is left when it is destroyed).
    std::lock_guard<std::timed_mutex> lock(shared_->issue_mutex);
    // Destroyed or aborted: NCCL dropped the registration with the communicator. After a
    // failure the peers may never come to a collective deregistration: leave it to the abort.
    if (!handle_->comm || shared_->health()->failed()) return;
    int previous = -1;
    cudaGetDevice(&previous);
    cudaSetDevice(shared_->device().index);
    const ncclResult_t status = window_ ? ncclCommWindowDeregister(handle_->comm, window_)
                                        : ncclCommDeregister(handle_->comm, local_);
    if (previous >= 0) cudaSetDevice(previous);
    if (status != ncclSuccess) {
      Logger(rank_, LogLevel::Warn, stderr)
          .warn("deregistering ", what_, " from group '", handle_->name, "' (rank ", rank_,
                ") failed: ", ncclGetErrorString(status), " (", ncclGetLastError(handle_->comm),
                ")");
    }
  }

 private:
  std::shared_ptr<NcclCommHandle> handle_;
  std::shared_ptr<NcclShared> shared_;
  int rank_;
  std::string what_;
  void* local_ = nullptr;             // ncclCommRegister's handle
  ncclWindow_t window_ = nullptr;     // or ncclCommWindowRegister's window
};

}  // namespace

std::unique_ptr<RegisteredBuffer> NcclCommunicator::issue_register(void* data, size_t bytes,
                                                                   BufferRegistration kind,
                                                                   const std::string& what) {
  const std::string where =
      str_cat(what, " (", bytes, " bytes at ", data, ") with group '", name(), "' (rank ",
              rank(), " of ", size(), ")");
  DeviceGuard guard(device());
  std::lock_guard<std::timed_mutex> lock(shared_->issue_mutex);
  ncclComm_t comm = live_comm();
  // A window is registered collectively, and filled in only at ncclGroupEnd inside a
  // group: refuse it there.
  FSDP_CHECK(kind == BufferRegistration::local || shared_->group_depth == 0, ValueError,
             "symmetric registration of ", where, " inside group_start()/group_end()");
  void* local = nullptr;
  ncclWindow_t window = nullptr;
  try {
    if (kind == BufferRegistration::local) {
      FSDP_CALL(ncclCommRegister(comm, data, bytes, &local));
    } else {
      // Like ncclCommInitRank at start-up, this waits inside NCCL for every rank of the
      // group; a rank that never comes leaves it to the launcher to end the job.
      FSDP_CALL(ncclCommWindowRegister(comm, data, bytes, &window, NCCL_WIN_COLL_SYMMETRIC));
      FSDP_CHECK(window != nullptr, CommError, "NCCL returned no window (symmetric memory is "
                 "not supported on this system)");
    }
  } catch (const Error& e) {
    throw CommError(str_cat(buffer_registration_name(kind), " registration of ", where,
                            " failed: ", e.what(),
                            kind == BufferRegistration::symmetric
                                ? " (the memory must come from ncclMemAlloc / cuMem, start at a "
                                  "multiple of 4096 bytes in its allocation, and have the same "
                                  "size on every rank)"
                                : ""));
  }
  return std::make_unique<NcclRegisteredBuffer>(handle_, shared_, rank(), what, local, window);
}

void* nccl_mem_alloc(Device device, size_t bytes, const std::string& what) {
  FSDP_CHECK(device.is_cuda(), DeviceError, "ncclMemAlloc for ", what, " on ", device.str(),
             ": NCCL memory is device memory");
  DeviceGuard guard(device);
  void* data = nullptr;
  const ncclResult_t status = ncclMemAlloc(&data, bytes);
  if (status != ncclSuccess || data == nullptr) {
    const char* detail = ncclGetLastError(nullptr);
    cudaGetLastError();  // a failed cudaMalloc fallback leaves its error behind: clear it
    FSDP_THROW(OutOfMemoryError, "ncclMemAlloc of ", bytes, " bytes for ", what, " on ",
               device.str(), " failed: ", ncclGetErrorString(status),
               (detail && *detail) ? str_cat(" (", detail, ")") : std::string());
  }
  return data;
}

std::string nccl_mem_free(Device device, void* data) {
  if (!data) return "";
  int previous = -1;
  cudaGetDevice(&previous);
  cudaSetDevice(device.index);
  // Unlike cudaFree, unmapping cuMem memory does not wait for kernels that use it.
  const cudaError_t synced = cudaDeviceSynchronize();
  const ncclResult_t status = ncclMemFree(data);
  if (previous >= 0) cudaSetDevice(previous);
  if (synced != cudaSuccess) return str_cat("cudaDeviceSynchronize: ", cudaGetErrorString(synced));
  if (status != ncclSuccess) return str_cat("ncclMemFree: ", ncclGetErrorString(status));
  return "";
}

}  // namespace fsdp
