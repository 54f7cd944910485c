// NcclCommunicator: the GPU backend. One ncclComm_t per communicator; every operation is
// queued on the caller's CUDA stream and returns at once with a Work holding an event
// recorded after it, which the World's watchdog also watches.
//
// Only built with CUDA (FSDP_WITH_CUDA). The implementation is compiled by nvcc (see
// nccl_check.h for why); this header does not include nccl.h, so any C++ file may use it.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/health.h"
#include "collectives/watchdog.h"

// NCCL's communicator handle, declared exactly as nccl.h declares it.
struct ncclComm;
typedef struct ncclComm* ncclComm_t;

namespace fsdp {

// One ncclComm_t, or nothing once it was destroyed or aborted. Guarded by
// NcclShared::issue_mutex.
struct NcclCommHandle {
  ncclComm_t comm = nullptr;
  std::string name;
  bool aborted = false;
};

// One issued operation as the watchdog sees it. It is watched from before the NCCL call,
// since the call itself may block (e.g. connecting to a peer that never comes), until the
// event recorded after it completes.
struct NcclLaunch {
  enum State : int { Pending = 0, Recorded = 1, Cancelled = 2 };
  std::atomic<int> state{Pending};
  Event done;  // written before `state` becomes Recorded, never after
  bool finished() const;
};

// What the NCCL communicators of one World share: the job's health, the lock held while
// calling NCCL, the open group (ncclGroupStart covers every communicator of the thread),
// the registry of communicators to abort, and the watchdog thread.
class NcclShared {
 public:
  NcclShared(std::shared_ptr<CommHealth> health, Device device,
             std::chrono::milliseconds watchdog_poll);
  ~NcclShared();  // stops the watchdog first
  NcclShared(const NcclShared&) = delete;
  NcclShared& operator=(const NcclShared&) = delete;

  const std::shared_ptr<CommHealth>& health() const { return health_; }
  Device device() const { return device_; }
  Watchdog& watchdog() { return *watchdog_; }

  void register_comm(const std::shared_ptr<NcclCommHandle>& handle);
  // ncclCommAbort on every live communicator (from any thread).
  void abort_all();
  // The first asynchronous error a live communicator reports, or "".
  std::string poll_errors();

  // Held while a thread is inside NCCL, so that an abort from the watchdog does not free
  // a communicator under a call in progress. The watchdog waits for it only briefly: a
  // thread stuck inside NCCL is exactly what an abort must interrupt.
  std::timed_mutex issue_mutex;

  // An operation issued inside an open group: its event is recorded at group_end().
  struct Deferred {
    std::shared_ptr<WorkState> work;
    std::shared_ptr<NcclLaunch> launch;
    Stream stream;
  };
  int group_depth = 0;
  std::vector<Deferred> deferred;
  // Cleanups that must wait until the group is launched (pre-multiplied reduction ops).
  std::vector<std::function<void()>> after_group;

 private:
  std::shared_ptr<CommHealth> health_;
  Device device_;
  std::mutex registry_mu_;
  std::vector<std::weak_ptr<NcclCommHandle>> registry_;
  std::unique_ptr<Watchdog> watchdog_;  // last: its thread uses the members above
};

// Device memory NCCL can register for zero-copy and symmetric collectives (see
// BufferRegistration): ncclMemAlloc on `device`, which maps cuMem (VMM) memory, rounded up
// to the allocation granularity, and makes it accessible to every peer GPU. Throws
// OutOfMemoryError naming `what` when NCCL cannot allocate it. Implemented in
// nccl_memory.cu.
void* nccl_mem_alloc(Device device, size_t bytes, const std::string& what);
// Waits for `device` to finish its work (the memory may still be read by a queued
// collective), then ncclMemFree. Returns NCCL's error, "" on success: callers are
// destructors, which report rather than throw.
std::string nccl_mem_free(Device device, void* data);

class NcclCommunicator final : public Communicator {
 public:
  // A new NCCL unique id (ncclGetUniqueId), as bytes to hand to the other ranks.
  static std::string make_unique_id();
  // The first communicator of a job: every one of `size` ranks calls this with the id
  // rank 0 made (ncclCommInitRank), on the shared state's device.
  static std::unique_ptr<NcclCommunicator> create(const std::string& unique_id, int rank,
                                                  int size, std::string name,
                                                  std::shared_ptr<NcclShared> shared);
  ~NcclCommunicator() override;

  // Ranks that pass the same `color` form a new communicator, ordered by `key`
  // (ncclCommSplit; collective over this communicator).
  std::unique_ptr<NcclCommunicator> split(std::string name, int color, int key);

  const char* backend() const override { return "nccl"; }
  // The raw communicator, for the bench's raw-NCCL baseline. Do not destroy it.
  ncclComm_t nccl_comm() const;
  void abort(const std::string& reason) override;

 protected:
  Work issue_all_gather(const void* send, void* recv, size_t count_per_rank, DType dtype,
                        const Stream& stream) override;
  Work issue_reduce_scatter(const void* send, void* recv, size_t count_per_rank, DType dtype,
                            ReduceOp op, const Stream& stream, double prescale) override;
  Work issue_all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                        const Stream& stream, double prescale) override;
  Work issue_broadcast(void* buf, size_t count, DType dtype, int root,
                       const Stream& stream) override;
  Work issue_send(const void* buf, size_t count, DType dtype, int peer,
                  const Stream& stream) override;
  Work issue_recv(void* buf, size_t count, DType dtype, int peer, const Stream& stream) override;
  Work issue_all_to_all(const void* send, const std::vector<size_t>& send_counts, void* recv,
                        const std::vector<size_t>& recv_counts, DType dtype,
                        const Stream& stream) override;
  void issue_barrier() override;
  // ncclCommRegister / ncclCommWindowRegister (nccl_memory.cu).
  std::unique_ptr<RegisteredBuffer> issue_register(void* data, size_t bytes,
                                                   BufferRegistration kind,
                                                   const std::string& what) override;
  void issue_group_start() override;
  void issue_group_end() override;

 private:
  NcclCommunicator(std::shared_ptr<NcclCommHandle> handle, int rank, int size,
                   std::shared_ptr<NcclShared> shared);
  ncclComm_t live_comm() const;  // throws CommError once aborted; issue_mutex held
  // Issues one operation: watches it, runs `call(comm)` (the NCCL call) under the issue
  // lock, then records the Work's event after it (at group_end() inside a group).
  template <typename Call>
  Work issue_watched(CollectiveKind kind, size_t count, DType dtype, const Stream& stream,
                     Call&& call);
  // Issues a reduce-scatter (all == false) or all-reduce (all == true) with NCCL's
  // reduction for `op`, creating a pre-multiplied sum for prescale != 1.
  Work issue_reduction(bool all, const void* send, void* recv, size_t count, DType dtype,
                       ReduceOp op, const Stream& stream, double prescale);
  // Marks the end of an issued operation on `stream`.
  void record_end(WorkState& work, NcclLaunch& launch, const Stream& stream);

  std::shared_ptr<NcclCommHandle> handle_;
  std::shared_ptr<NcclShared> shared_;
  // For barrier(): one float on the device and a stream of our own.
  Stream barrier_stream_;
  void* barrier_scratch_ = nullptr;
};

}  // namespace fsdp
