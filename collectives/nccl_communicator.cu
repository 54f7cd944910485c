// Compiled by nvcc (host code only): see nccl_check.h.
#include "collectives/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "collectives/nccl_check.h"
#include "collectives/nccl_types.h"
#include "runtime/core/cuda_check.h"

namespace fsdp {
namespace {

// How long the watchdog waits for a thread inside NCCL before aborting under it.
constexpr auto kAbortLockWait = std::chrono::seconds(2);

ncclDataType_t reduction_type(DType dtype, const std::string& group) {
  FSDP_CHECK(dtype != DType::u16, DTypeError, "group '", group, "': NCCL cannot reduce u16 data");
  return nccl_data_type(dtype);
}

// A scalar in the data's own type, as ncclRedOpCreatePreMulSum reads it (so for bf16 data
// NCCL scales by the bf16 rounding of the factor).
struct ScalarBytes {
  alignas(8) unsigned char bytes[8] = {0};
};

ScalarBytes scalar_bytes(DType dtype, double value) {
  ScalarBytes out;
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T v = from_double<T>(value);
    static_assert(sizeof(T) <= sizeof(out.bytes), "scalar too large");
    std::memcpy(out.bytes, &v, sizeof(T));
  });
  return out;
}

}  // namespace

// ---- NcclShared

NcclShared::NcclShared(std::shared_ptr<CommHealth> health, Device device,
                       std::chrono::milliseconds watchdog_poll)
    : health_(std::move(health)), device_(device) {
  Watchdog::Hooks hooks;
  hooks.abort_all = [this] { abort_all(); };
  hooks.poll_errors = [this] { return poll_errors(); };
  watchdog_ = std::make_unique<Watchdog>(health_, std::move(hooks), watchdog_poll, device_);
}

NcclShared::~NcclShared() { watchdog_.reset(); }

void NcclShared::register_comm(const std::shared_ptr<NcclCommHandle>& handle) {
  std::lock_guard<std::mutex> lock(registry_mu_);
  registry_.push_back(handle);
}

void NcclShared::abort_all() {
  std::unique_lock<std::timed_mutex> issuing(issue_mutex, std::defer_lock);
  (void)issuing.try_lock_for(kAbortLockWait);
  std::lock_guard<std::mutex> lock(registry_mu_);
  for (auto& weak : registry_) {
    auto handle = weak.lock();
    if (!handle || !handle->comm) continue;
    ncclCommAbort(handle->comm);  // its result cannot change what happens next
    handle->comm = nullptr;
    handle->aborted = true;
  }
}

std::string NcclShared::poll_errors() {
  // Skip this round rather than wait while the main thread is issuing.
  std::unique_lock<std::timed_mutex> issuing(issue_mutex, std::try_to_lock);
  if (!issuing.owns_lock()) return "";
  std::lock_guard<std::mutex> lock(registry_mu_);
  for (auto& weak : registry_) {
    auto handle = weak.lock();
    if (!handle || !handle->comm) continue;
    ncclResult_t status = ncclSuccess;
    if (ncclCommGetAsyncError(handle->comm, &status) != ncclSuccess) continue;
    if (status != ncclSuccess && status != ncclInProgress) {
      return str_cat("NCCL reported an error on group '", handle->name, "' at step ",
                     health_->step(), ": ", ncclGetErrorString(status), " (",
                     ncclGetLastError(handle->comm), ")");
    }
  }
  return "";
}

// ---- NcclCommunicator

NcclCommunicator::NcclCommunicator(std::shared_ptr<NcclCommHandle> handle, int rank, int size,
                                   std::shared_ptr<NcclShared> shared)
    : Communicator(handle->name, rank, size, shared->device(), shared->health()),
      handle_(std::move(handle)), shared_(std::move(shared)) {
  shared_->register_comm(handle_);
}

std::string NcclCommunicator::make_unique_id() {
  ncclUniqueId id;
  FSDP_CALL(ncclGetUniqueId(&id));
  return std::string(id.internal, sizeof(id.internal));
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(const std::string& unique_id,
                                                           int rank, int size, std::string name,
                                                           std::shared_ptr<NcclShared> shared) {
  ncclUniqueId id;
  FSDP_CHECK(unique_id.size() == sizeof(id.internal), LaunchError, "an NCCL unique id has ",
             sizeof(id.internal), " bytes, got ", unique_id.size());
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  DeviceGuard guard(shared->device());
  auto handle = std::make_shared<NcclCommHandle>();
  handle->name = std::move(name);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.commName = handle->name.c_str();
  {
    std::lock_guard<std::timed_mutex> lock(shared->issue_mutex);
    FSDP_CALL(ncclCommInitRankConfig(&handle->comm, size, id, rank, &config));
  }
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(std::move(handle), rank, size, std::move(shared)));
}

std::unique_ptr<NcclCommunicator> NcclCommunicator::split(std::string name, int color, int key) {
  health()->raise_if_failed();
  DeviceGuard guard(device());
  auto handle = std::make_shared<NcclCommHandle>();
  handle->name = std::move(name);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.commName = handle->name.c_str();
  int rank = 0, size = 0;
  {
    std::lock_guard<std::timed_mutex> lock(shared_->issue_mutex);
    FSDP_CHECK(shared_->group_depth == 0, ValueError, "split of group '", this->name(),
               "' inside group_start()/group_end()");
    FSDP_CALL(ncclCommSplit(live_comm(), color, key, &handle->comm, &config));
    FSDP_CHECK(handle->comm != nullptr, CommError, "ncclCommSplit of group '", this->name(),
               "' returned no communicator for color ", color);
    FSDP_CALL(ncclCommUserRank(handle->comm, &rank));
    FSDP_CALL(ncclCommCount(handle->comm, &size));
  }
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(std::move(handle), rank, size, shared_));
}

NcclCommunicator::~NcclCommunicator() {
  // Destructor: failures here cannot be reported and change nothing for the caller.
  std::lock_guard<std::timed_mutex> lock(shared_->issue_mutex);
  if (handle_->comm) {
    // After a failure the peers may never take part again: a clean destroy could wait
    // for them forever, so the communicator is aborted instead.
    if (health()->failed()) {
      ncclCommAbort(handle_->comm);
    } else {
      ncclCommDestroy(handle_->comm);
    }
    handle_->comm = nullptr;
  }
  if (barrier_scratch_) {
    int previous = -1;
    cudaGetDevice(&previous);
    cudaSetDevice(device().index);
    cudaFree(barrier_scratch_);
    if (previous >= 0) cudaSetDevice(previous);
  }
}

ncclComm_t NcclCommunicator::nccl_comm() const {
  std::lock_guard<std::timed_mutex> lock(shared_->issue_mutex);
  return live_comm();
}

ncclComm_t NcclCommunicator::live_comm() const {
  health()->raise_if_failed();
  FSDP_CHECK(handle_->comm != nullptr, CommError, "communicator '", name(),
             "' was aborted and cannot be used");
  return handle_->comm;
}

void NcclCommunicator::abort(const std::string& reason) {
  health()->record_failure(FailureKind::Aborted,
                           str_cat("communicator '", name(), "' aborted: ", reason));
  shared_->abort_all();
}

bool NcclLaunch::finished() const {
  const int s = state.load(std::memory_order_acquire);
  return s == Cancelled || (s == Recorded && done.query());
}

void NcclCommunicator::record_end(WorkState& work, NcclLaunch& launch, const Stream& stream) {
  launch.done = Event::create(device());
  launch.done.record(stream);
  launch.state.store(NcclLaunch::Recorded, std::memory_order_release);
  work.done = launch.done;
  work.issued = true;
}

template <typename Call>
Work NcclCommunicator::issue_watched(CollectiveKind kind, size_t count, DType dtype,
                                     const Stream& stream, Call&& call) {
  auto launch = std::make_shared<NcclLaunch>();
  shared_->watchdog().watch([launch] { return launch->finished(); }, info(kind, count, dtype));
  try {
    std::lock_guard<std::timed_mutex> lock(shared_->issue_mutex);
    call(live_comm());
  } catch (...) {
    launch->state.store(NcclLaunch::Cancelled, std::memory_order_release);
    // A call the watchdog interrupted fails with NCCL's own error; the cause is the
    // watchdog's (e.g. a TimeoutError naming the operation).
    health()->raise_if_failed();
    throw;
  }
  auto work = std::make_shared<WorkState>();
  work->health = health();
  if (shared_->group_depth > 0) {
    shared_->deferred.push_back({work, launch, stream});
  } else {
    record_end(*work, *launch, stream);
  }
  return Work(work);
}

Work NcclCommunicator::issue_all_gather(const void* send, void* recv, size_t count_per_rank,
                                        DType dtype, const Stream& stream) {
  const NcclBuffer b = nccl_movement(dtype, count_per_rank);
  return issue_watched(CollectiveKind::all_gather, count_per_rank, dtype, stream,
                       [&](ncclComm_t comm) {
                         FSDP_CALL(ncclAllGather(send, recv, b.count, b.type, comm,
                                                 stream.cuda_stream()));
                       });
}

Work NcclCommunicator::issue_reduction(bool all, const void* send, void* recv, size_t count,
                                       DType dtype, ReduceOp op, const Stream& stream,
                                       double prescale) {
  const ncclDataType_t type = reduction_type(dtype, name());
  const bool custom = prescale != 1.0;
  double scale = prescale;
  if (custom && op == ReduceOp::Avg) {
    // A pre-multiplied sum; for Avg the division by the group size is folded into it.
    FSDP_CHECK(is_floating(dtype), ValueError, "group '", name(),
               "': NCCL cannot combine avg with a prescale on ", dtype_name(dtype), " data");
    scale = prescale / double(size());
  }
  const CollectiveKind kind = all ? CollectiveKind::all_reduce : CollectiveKind::reduce_scatter;
  return issue_watched(kind, count, dtype, stream, [&](ncclComm_t comm) {
    ncclRedOp_t nccl_op = nccl_reduce_op(op);
    if (custom) {
      ScalarBytes scalar = scalar_bytes(dtype, scale);
      FSDP_CALL(ncclRedOpCreatePreMulSum(&nccl_op, scalar.bytes, type, ncclScalarHostImmediate,
                                         comm));
    }
    if (all) {
      FSDP_CALL(ncclAllReduce(send, recv, count, type, nccl_op, comm, stream.cuda_stream()));
    } else {
      FSDP_CALL(ncclReduceScatter(send, recv, count, type, nccl_op, comm, stream.cuda_stream()));
    }
    if (!custom) return;
    // Inside a group the operation is launched only at group_end(): keep the op until then.
    if (shared_->group_depth > 0) {
      shared_->after_group.push_back(
          [nccl_op, comm] { FSDP_CALL(ncclRedOpDestroy(nccl_op, comm)); });
    } else {
      FSDP_CALL(ncclRedOpDestroy(nccl_op, comm));
    }
  });
}

Work NcclCommunicator::issue_reduce_scatter(const void* send, void* recv, size_t count_per_rank,
                                            DType dtype, ReduceOp op, const Stream& stream,
                                            double prescale) {
  return issue_reduction(false, send, recv, count_per_rank, dtype, op, stream, prescale);
}

Work NcclCommunicator::issue_all_reduce(const void* send, void* recv, size_t count, DType dtype,
                                        ReduceOp op, const Stream& stream, double prescale) {
  return issue_reduction(true, send, recv, count, dtype, op, stream, prescale);
}

Work NcclCommunicator::issue_broadcast(void* buf, size_t count, DType dtype, int root,
                                       const Stream& stream) {
  const NcclBuffer b = nccl_movement(dtype, count);
  return issue_watched(CollectiveKind::broadcast, count, dtype, stream, [&](ncclComm_t comm) {
    FSDP_CALL(ncclBroadcast(buf, buf, b.count, b.type, root, comm, stream.cuda_stream()));
  });
}

Work NcclCommunicator::issue_send(const void* buf, size_t count, DType dtype, int peer,
                                  const Stream& stream) {
  const NcclBuffer b = nccl_movement(dtype, count);
  return issue_watched(CollectiveKind::send, count, dtype, stream, [&](ncclComm_t comm) {
    FSDP_CALL(ncclSend(buf, b.count, b.type, peer, comm, stream.cuda_stream()));
  });
}

Work NcclCommunicator::issue_recv(void* buf, size_t count, DType dtype, int peer,
                                  const Stream& stream) {
  const NcclBuffer b = nccl_movement(dtype, count);
  return issue_watched(CollectiveKind::recv, count, dtype, stream, [&](ncclComm_t comm) {
    FSDP_CALL(ncclRecv(buf, b.count, b.type, peer, comm, stream.cuda_stream()));
  });
}

Work NcclCommunicator::issue_all_to_all(const void* send, const std::vector<size_t>& send_counts,
                                        void* recv, const std::vector<size_t>& recv_counts,
                                        DType dtype, const Stream& stream) {
  size_t sent = 0;
  for (size_t c : send_counts) sent += c;
  const size_t esize = dtype_size(dtype);
  return issue_watched(CollectiveKind::all_to_all, sent, dtype, stream, [&](ncclComm_t comm) {
    // One group of a send and a receive per peer with data (NCCL pairs them by peer).
    FSDP_CALL(ncclGroupStart());
    size_t send_at = 0, recv_at = 0;
    for (size_t p = 0; p < send_counts.size(); ++p) {
      if (send_counts[p] > 0) {
        const NcclBuffer b = nccl_movement(dtype, send_counts[p]);
        FSDP_CALL(ncclSend(static_cast<const char*>(send) + send_at, b.count, b.type, int(p),
                           comm, stream.cuda_stream()));
      }
      if (recv_counts[p] > 0) {
        const NcclBuffer b = nccl_movement(dtype, recv_counts[p]);
        FSDP_CALL(ncclRecv(static_cast<char*>(recv) + recv_at, b.count, b.type, int(p), comm,
                           stream.cuda_stream()));
      }
      send_at += send_counts[p] * esize;
      recv_at += recv_counts[p] * esize;
    }
    FSDP_CALL(ncclGroupEnd());
  });
}

void NcclCommunicator::issue_barrier() {
  // NCCL has no barrier: an all-reduce of one float that the host waits for.
  FSDP_CHECK(shared_->group_depth == 0, ValueError, "barrier on group '", name(),
             "' inside group_start()/group_end()");
  if (!barrier_scratch_) {
    DeviceGuard guard(device());
    barrier_stream_ = Stream::create_cuda(device().index);
    FSDP_CALL(cudaMalloc(&barrier_scratch_, sizeof(float)));
    FSDP_CALL(cudaMemsetAsync(barrier_scratch_, 0, sizeof(float), barrier_stream_.cuda_stream()));
  }
  Work done = issue_watched(CollectiveKind::barrier, 0, DType::u8, barrier_stream_,
                            [&](ncclComm_t comm) {
                              FSDP_CALL(ncclAllReduce(barrier_scratch_, barrier_scratch_, 1,
                                                      ncclFloat32, ncclSum, comm,
                                                      barrier_stream_.cuda_stream()));
                            });
  done.synchronize();
}

void NcclCommunicator::issue_group_start() {
  std::lock_guard<std::timed_mutex> lock(shared_->issue_mutex);
  FSDP_CALL(ncclGroupStart());
  ++shared_->group_depth;
}

void NcclCommunicator::issue_group_end() {
  std::vector<NcclShared::Deferred> deferred;
  {
    std::lock_guard<std::timed_mutex> lock(shared_->issue_mutex);
    FSDP_CHECK(shared_->group_depth > 0, ValueError, "group_end() on group '", name(),
               "' without a matching group_start()");
    --shared_->group_depth;
    if (shared_->group_depth > 0) {
      FSDP_CALL(ncclGroupEnd());
      return;
    }
    deferred.swap(shared_->deferred);
    std::vector<std::function<void()>> cleanups;
    cleanups.swap(shared_->after_group);
    try {
      FSDP_CALL(ncclGroupEnd());
    } catch (...) {
      for (auto& d : deferred) d.launch->state.store(NcclLaunch::Cancelled);
      health()->raise_if_failed();  // the watchdog's cause, if it interrupted the launch
      throw;
    }
    for (auto& cleanup : cleanups) cleanup();
  }
  // The group's operations are on their streams now: mark each one's end.
  for (auto& d : deferred) record_end(*d.work, *d.launch, d.stream);
}

}  // namespace fsdp
