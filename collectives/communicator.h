// Communicator: one group of ranks that run collectives together.
//
// Two backends implement it: NcclCommunicator (GPUs; every operation is queued on the given
// CUDA stream and returns at once) and MpiCommunicator (CPUs; a real multi-process backend,
// so the sharding scheduler runs unchanged under `mpirun -np N` without a GPU). Both are
// created by a World (collectives/world.h), which also owns the state they share.
//
// The public operations are non-virtual: this class checks the arguments, counts the
// operation and folds it into the schedule hash, then hands it to the backend's issue_*
// method. Every rank of the group must issue the same operations in the same order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/health.h"
#include "runtime/core/device.h"
#include "runtime/core/dtype.h"
#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"

namespace fsdp {

enum class ReduceOp : uint8_t { Sum, Avg, Max, Min };
const char* reduce_op_name(ReduceOp op);  // "sum", "avg", "max", "min"

enum class CollectiveKind : uint8_t {
  all_gather, reduce_scatter, all_reduce, broadcast, send, recv, barrier, all_to_all
};
const char* collective_name(CollectiveKind kind);  // "all_gather", ...

// One issued collective, as error messages name it:
// "all_reduce of 1024 x f32 on group 'dp_shard/rs' (rank 0 of 2) at step 7".
struct CollectiveInfo {
  CollectiveKind kind = CollectiveKind::barrier;
  size_t count = 0;
  DType dtype = DType::u8;
  std::string group;
  int rank = 0;
  int size = 1;
  int64_t step = -1;
  std::string str() const;
};

// The state behind a Work handle, filled in by the backend that issued the operation.
struct WorkState {
  Event done;           // recorded after the operation on its stream (NCCL); empty on MPI
  bool issued = false;  // false while the operation waits in an open group_start()
  std::shared_ptr<const CommHealth> health;
};

// Handle to an issued collective. NCCL: an event recorded on the stream after the
// operation. MPI: the operation had completed when the call returned (or, inside a group,
// completes at group_end()).
class Work {
 public:
  Work() = default;  // an operation that has already completed
  explicit Work(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}

  // Later work queued on `stream` waits for the operation (GPU); nothing to do on CPU.
  void wait(const Stream& stream) const;
  // Blocks the host until the operation has finished. Raises the job's failure (e.g.
  // TimeoutError from the watchdog) if one was recorded.
  void synchronize() const;
  // True once the operation has finished.
  bool done() const;

 private:
  void check_issued(const char* what) const;
  std::shared_ptr<WorkState> state_;
};

// NCCL user-buffer registration (Communicator::register_buffer). What NCCL needs of the
// memory, as of NCCL 2.28:
// - local: ncclCommRegister. Only this rank takes part. Intra-node zero-copy (the P2P
//   transport reading and writing the user buffer directly instead of staging through
//   NCCL's own buffers) needs memory NCCL can export to the peer process: cuMem (VMM)
//   allocations, which ncclMemAlloc makes. cudaMalloc memory registers without error but
//   is used for zero-copy only with NCCL_LEGACY_CUDA_REGISTER=1 (cudaIpc handles). NCCL
//   2.28 uses it for ring all-gathers (the receive buffer must be registered); its
//   reduce-scatters over NVLink do not use it.
// - symmetric: ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC). Collective: every rank of
//   the communicator registers, in the same order, a buffer of the same size. The memory
//   must be cuMem-backed (ncclMemAlloc), the window must start at a multiple of 4096 bytes
//   inside its allocation and lie in one physical allocation. A collective whose send and
//   receive buffers lie in such windows, at the same offset on every rank, may run NCCL's
//   symmetric kernels: fewer SMs and lower latency, when every rank is reachable over
//   NVLink. They take all-gathers, and reduce-scatters / all-reduces of floating types up to
//   32 bits with sum or avg; NCCL's pre-multiplied sum (a prescale != 1) is not among them.
// Every rank must pass registered buffers to a collective or none must (NCCL: mixing is
// undefined). A buffer must stay allocated until its registration is gone.
enum class BufferRegistration : uint8_t { local, symmetric };
const char* buffer_registration_name(BufferRegistration kind);  // "local", "symmetric"
// Accepts "local" | "symmetric"; throws ConfigError naming the value otherwise.
BufferRegistration buffer_registration_from_name(const std::string& name);

// What a backend keeps for one registered buffer; deregisters it when destroyed.
class RegisteredBuffer {
 public:
  virtual ~RegisteredBuffer() = default;
};

// A buffer registered with one communicator, deregistered when this handle is destroyed or
// reset() (move-only). Inactive (nothing registered) when the backend registers nothing:
// MPI, whose collectives run on host memory. Destroy it only once the device no longer
// uses the buffer in a collective; it may outlive the communicator (then nothing is left
// to deregister: destroying or aborting an NCCL communicator drops its registrations).
class Registration {
 public:
  Registration() = default;
  Registration(std::unique_ptr<RegisteredBuffer> impl, const void* data, size_t bytes,
               BufferRegistration kind)
      : impl_(std::move(impl)), data_(data), bytes_(bytes), kind_(kind) {}
  Registration(Registration&&) noexcept = default;
  Registration& operator=(Registration&&) noexcept = default;

  bool active() const { return impl_ != nullptr; }
  const void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  BufferRegistration kind() const { return kind_; }
  void reset() { impl_.reset(); }

 private:
  std::unique_ptr<RegisteredBuffer> impl_;
  const void* data_ = nullptr;
  size_t bytes_ = 0;
  BufferRegistration kind_ = BufferRegistration::local;
};

class Communicator {
 public:
  // Operations issued so far, by kind, and the payload bytes they moved: the output size
  // of all-gathers, the input size of reduce-scatters, the buffer size of the others.
  struct Counts {
    uint64_t all_gather = 0, reduce_scatter = 0, all_reduce = 0, broadcast = 0, send = 0,
             recv = 0, barrier = 0, all_to_all = 0;
    uint64_t bytes = 0;
  };

  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }  // e.g. "dp_shard/ag"
  Device device() const { return device_; }
  virtual const char* backend() const = 0;  // "nccl" or "mpi"

  // ---- raw forms. Counts are elements; for all_gather and reduce_scatter, per rank.
  // In place where NCCL allows it: all_gather with send == recv + rank*count,
  // reduce_scatter with recv == send + rank*count, all_reduce with send == recv.
  Work all_gather(const void* send, void* recv, size_t count_per_rank, DType dtype,
                  const Stream& stream);
  // prescale != 1 multiplies every input by it before the sum (Sum and Avg only).
  Work reduce_scatter(const void* send, void* recv, size_t count_per_rank, DType dtype,
                      ReduceOp op, const Stream& stream, double prescale = 1.0);
  Work all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                  const Stream& stream, double prescale = 1.0);
  Work broadcast(void* buf, size_t count, DType dtype, int root, const Stream& stream);
  Work send(const void* buf, size_t count, DType dtype, int peer, const Stream& stream);
  Work recv(void* buf, size_t count, DType dtype, int peer, const Stream& stream);
  // Every rank sends send_counts[p] elements to each rank p and receives recv_counts[p]
  // from it (expert parallelism's dispatch and combine). The parts lie one after the other
  // in rank order in `send` and in `recv`; rank p's recv_counts[q] must equal rank q's
  // send_counts[p] (exchange the counts first). Counts are data: they stay out of the
  // schedule hash. NCCL: grouped sends and receives; MPI: MPI_Ialltoallv.
  Work all_to_all(const void* send, const std::vector<size_t>& send_counts, void* recv,
                  const std::vector<size_t>& recv_counts, DType dtype, const Stream& stream);
  // Returns when every rank of the group has reached it.
  void barrier();
  // Operations between group_start() and group_end() are issued together (ncclGroupStart
  // / ncclGroupEnd; on MPI they are started together and completed at group_end()). Their
  // Work handles become usable after group_end(). Groups nest.
  void group_start();
  void group_end();

  // ---- tensor forms: contiguous tensors on this communicator's device, of one dtype.
  // all_gather: out.numel() == in.numel() * size(). reduce_scatter: in.numel() ==
  // out.numel() * size(). Sizes that do not divide evenly are rejected: pad them.
  Work all_gather(const Tensor& out, const Tensor& in, const Stream& stream);
  Work reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op, const Stream& stream,
                      double prescale = 1.0);
  Work all_reduce(const Tensor& t, ReduceOp op, const Stream& stream, double prescale = 1.0);
  Work broadcast(const Tensor& t, int root, const Stream& stream);

  // ---- buffer registration (see BufferRegistration for what NCCL requires of the memory)
  // Registers the device memory [data, data + bytes) with this communicator; `what` names
  // the buffer in errors ("gathered weights slot 2"). symmetric is collective over the
  // group and may not be called inside group_start()/group_end(). MPI: a no-op that
  // returns an inactive Registration.
  Registration register_buffer(void* data, size_t bytes, BufferRegistration kind,
                               const std::string& what);
  // The tensor's bytes (contiguous, on this communicator's device).
  Registration register_buffer(const Tensor& t, BufferRegistration kind, const std::string& what);

  // ---- bookkeeping for tests and messages
  const Counts& counts() const { return counts_; }
  void reset_counts() { counts_ = Counts(); }
  // A running hash of the operations issued (kind, element count, dtype, reduce op,
  // root): equal on every rank exactly when they issued the same schedule.
  uint64_t schedule_hash() const { return hash_; }
  // The step being run, named in timeout messages. Shared by every communicator of the
  // World (one step counter per job).
  void set_step(int64_t step) { health_->set_step(step); }
  int64_t step() const { return health_->step(); }
  const std::shared_ptr<CommHealth>& health() const { return health_; }

  // Ends this communicator at once: pending operations are abandoned (NCCL: ncclCommAbort)
  // and `reason` is recorded as the job's failure, so every later call raises it.
  virtual void abort(const std::string& reason) = 0;

 protected:
  Communicator(std::string name, int rank, int size, Device device,
               std::shared_ptr<CommHealth> health);

  // Backends implement these. Arguments have been checked; counts are elements.
  virtual Work issue_all_gather(const void* send, void* recv, size_t count_per_rank,
                                DType dtype, const Stream& stream) = 0;
  virtual Work issue_reduce_scatter(const void* send, void* recv, size_t count_per_rank,
                                    DType dtype, ReduceOp op, const Stream& stream,
                                    double prescale) = 0;
  virtual Work issue_all_reduce(const void* send, void* recv, size_t count, DType dtype,
                                ReduceOp op, const Stream& stream, double prescale) = 0;
  virtual Work issue_broadcast(void* buf, size_t count, DType dtype, int root,
                               const Stream& stream) = 0;
  virtual Work issue_send(const void* buf, size_t count, DType dtype, int peer,
                          const Stream& stream) = 0;
  virtual Work issue_recv(void* buf, size_t count, DType dtype, int peer,
                          const Stream& stream) = 0;
  virtual Work issue_all_to_all(const void* send, const std::vector<size_t>& send_counts,
                                void* recv, const std::vector<size_t>& recv_counts, DType dtype,
                                const Stream& stream) = 0;
  virtual void issue_barrier() = 0;
  // Registers a checked, non-empty range; nullptr where the backend has nothing to register.
  virtual std::unique_ptr<RegisteredBuffer> issue_register(void* data, size_t bytes,
                                                           BufferRegistration kind,
                                                           const std::string& what) = 0;

  virtual void issue_group_start() = 0;
  virtual void issue_group_end() = 0;

  // The operation as messages name it (see CollectiveInfo).
  CollectiveInfo info(CollectiveKind kind, size_t count, DType dtype) const;
  std::string describe(CollectiveKind kind, size_t count, DType dtype) const {
    return info(kind, count, dtype).str();
  }

 private:
  void check_stream(const Stream& stream, CollectiveKind kind) const;
  void check_reduction(CollectiveKind kind, DType dtype, ReduceOp op, double prescale) const;
  void record(CollectiveKind kind, size_t count, DType dtype, ReduceOp op, int root,
              uint64_t bytes);
  void check_tensor(const Tensor& t, CollectiveKind kind, const char* role) const;
  // `whole` is `part` from every rank (all-gather output / reduce-scatter input).
  void check_split(CollectiveKind kind, const Tensor& whole, const char* whole_role,
                   const Tensor& part, const char* part_role) const;

  std::string name_;
  int rank_ = 0;
  int size_ = 1;
  Device device_;
  std::shared_ptr<CommHealth> health_;
  Counts counts_;
  uint64_t hash_;
};

}  // namespace fsdp
