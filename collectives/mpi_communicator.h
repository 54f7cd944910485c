// MpiCommunicator: the CPU backend. Host buffers; collectives over an MPI communicator.
//
// Bytes move with non-blocking MPI calls on MPI_BYTE (MPI_Iallgather, MPI_Ialltoall,
// MPI_Ibcast, MPI_Isend/Irecv); reductions are then done locally in rank order
// (host_reduce.h), so results are deterministic and bf16/f16 work although MPI has no such
// types. Requests are completed by a polling loop that sleeps between polls (CI runs
// -np 4 on 2 cores) and gives up at the collective timeout with a TimeoutError naming the
// operation, the group and the step, instead of hanging.
//
// Streams are ignored (CPU streams are inline); every operation has completed when it
// returns, except inside group_start()/group_end(), where operations are started in order
// and all completed at group_end() (so matching send/recv pairs cannot deadlock).
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/progress_board.h"

namespace fsdp {

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed with the communicator) and sets MPI_ERRORS_RETURN on
  // it so that failures come back as error codes. With a `board`, each operation is posted
  // on it, and a timeout names the ranks of this node that never reached the operation.
  MpiCommunicator(MPI_Comm comm, std::string name, std::shared_ptr<CommHealth> health,
                  std::shared_ptr<ProgressBoard> board = nullptr);
  ~MpiCommunicator() override;

  // A communicator over the same ranks as `parent` (MPI_Comm_dup; collective over it).
  static std::unique_ptr<MpiCommunicator> duplicate(MPI_Comm parent, std::string name,
                                                    std::shared_ptr<CommHealth> health,
                                                    std::shared_ptr<ProgressBoard> board = nullptr);
  // Ranks that pass the same `color` form a new communicator, ordered by `key`
  // (MPI_Comm_split; collective over this communicator).
  std::unique_ptr<MpiCommunicator> split(std::string name, int color, int key);

  const char* backend() const override { return "mpi"; }
  MPI_Comm mpi_comm() const { return comm_; }
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
  // Host buffers need no registration: a no-op (returns nullptr), so that code which
  // registers its buffers runs unchanged on the CPU.
  std::unique_ptr<RegisteredBuffer> issue_register(void* data, size_t bytes,
                                                   BufferRegistration kind,
                                                   const std::string& what) override;
  void issue_group_start() override;
  void issue_group_end() override;

 private:
  // One started operation: its requests, the buffer MPI writes into (when the result
  // needs a local reduction afterwards), and that reduction.
  struct PendingOp {
    std::string description;
    std::vector<MPI_Request> requests;
    std::unique_ptr<unsigned char[]> staging;
    std::function<void()> finish;
    std::shared_ptr<WorkState> work;  // set when started inside a group
    uint64_t index = 0;               // operations started on this group, this one included
  };

  PendingOp begin(CollectiveKind kind, size_t count, DType dtype);
  // Completes `op` now, or queues it until group_end() inside a group.
  Work start(PendingOp op);
  // Waits for every request of `ops` (until the timeout), then runs their finish steps in
  // order. On timeout, keeps their buffers alive (MPI may still write into them), records
  // the failure and throws TimeoutError.
  void complete(std::vector<PendingOp> ops);
  int byte_count(size_t bytes, const std::string& description) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::shared_ptr<ProgressBoard> board_;
  uint64_t board_key_ = 0;
  int board_entry_ = -1;
  std::vector<int> members_;  // world ranks, in group order
  uint64_t started_ = 0;      // operations started
  int group_depth_ = 0;
  std::vector<PendingOp> grouped_;
  // Requests that timed out, and the buffers they may still write into.
  std::vector<MPI_Request> abandoned_requests_;
  std::vector<std::unique_ptr<unsigned char[]>> abandoned_buffers_;
};

}  // namespace fsdp
