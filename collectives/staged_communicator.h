// StagedCommunicator: collectives on device buffers without one GPU per rank, so that any
// layout (TP x CP x EP x FSDP) runs with several ranks sharing one GPU.
//
// Each operation is three steps, the first and last on the caller's stream:
//   1. its input is copied into pinned host memory (a staging slot), after which the stream
//      writes the operation's token into mapped host memory (cuStreamWriteValue32);
//   2. this communicator's worker thread waits for that token, then moves the bytes with the
//      MPI backend (an MpiCommunicator over the same ranks, reused as is: the same
//      deterministic rank-order reductions as CPU ranks, so the same inputs give the same
//      bits) and publishes the operation's sequence number in a flag in mapped host memory;
//   3. the stream waits for the flag (cuStreamWaitValue32, no SM spins) and copies the result
//      back from the slot; an event after the copy is the Work's `done`.
// The worker makes no CUDA call (it only reads and writes host memory), so it can never wait
// for a driver lock that a CUDA call of the main thread holds while the device waits for it.
// So the contract is NCCL's: ordered on the caller's stream, returning at once with a Work,
// counted and hashed by Communicator, and operations of one communicator run in the order
// they were issued (a FIFO per communicator, one worker each, as NCCL serializes one
// communicator's kernels). Operations between group_start() and group_end() reach their
// streams at group_end() and move together (their sends and receives cannot deadlock).
//
// A collective that does not finish within the World's timeout ends the job: the MPI side
// records a TimeoutError naming the operation, the group, the step and the ranks that never
// reached it (ProgressBoard), the flag is published anyway so that no stream waits forever,
// and the main thread raises the failure at its next call. On a CPU device (the CI's case)
// the same worker and staging run, and every operation completes before it returns, as on
// the MPI backend.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/mpi_communicator.h"

namespace fsdp {

class StagedCommunicator final : public Communicator {
 public:
  // Moves bytes with `host` (whose ranks and name this communicator takes) for buffers on
  // `device`. Starts the worker thread.
  StagedCommunicator(std::unique_ptr<MpiCommunicator> host, Device device);
  ~StagedCommunicator() override;

  // Ranks that pass the same `color` form a new communicator, ordered by `key` (collective
  // over this communicator; waits for its issued operations first).
  std::unique_ptr<StagedCommunicator> split(std::string name, int color, int key);

  const char* backend() const override { return "staged"; }
  void abort(const std::string& reason) override;

  // Blocks until every operation issued so far has finished on the host side (the MPI
  // transfer; the copies back may still be queued on their streams). Raises the job's
  // failure if one was recorded.
  void drain();

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
  // Nothing to register: the device buffers are only ever read and written by copies.
  std::unique_ptr<RegisteredBuffer> issue_register(void* data, size_t bytes,
                                                   BufferRegistration kind,
                                                   const std::string& what) override;
  void issue_group_start() override;
  void issue_group_end() override;

 private:
  class Staging;  // pinned slots and the flag (CUDA), or plain host memory (CPU)

  // A byte range of the caller's buffer and where it lies in the operation's staging slot.
  struct Part {
    const void* src = nullptr;  // copied in (input parts)
    void* dst = nullptr;        // copied out (output parts)
    size_t at = 0;
    size_t bytes = 0;
  };
  // One operation as issued: what to copy in and out, and the MPI call between, given the
  // slot's bytes.
  struct Op {
    std::string description;
    Stream stream;
    size_t slot_bytes = 0;
    std::vector<Part> ins, outs;
    std::function<void(MpiCommunicator& host, unsigned char* slot)> move;
    std::shared_ptr<WorkState> work;
  };
  // What the worker runs for one launch (one operation, or a group's).
  struct Job {
    uint32_t seq = 0;
    std::vector<uint32_t> inputs;  // the input tokens its streams write (GPU)
    std::vector<std::function<void()>> moves;
    std::string description;
  };

  Op make_op(CollectiveKind kind, size_t count, DType dtype, const Stream& stream) const;
  // Issues `op` now, or keeps it for group_end() inside a group.
  Work issue(Op op);
  // Copies in, hands the MPI part to the worker, queues the copies back: see the file comment.
  void launch(std::vector<Op> ops);
  void run_worker();
  void run_job(Job& job);
  // Blocks until the worker has finished operation `seq`.
  void wait_finished(uint32_t seq);

  std::unique_ptr<MpiCommunicator> host_;
  std::unique_ptr<Staging> staging_;
  int group_depth_ = 0;
  std::vector<Op> grouped_;

  std::mutex mu_;
  std::condition_variable work_ready_, job_finished_;
  std::deque<Job> queue_;
  uint32_t submitted_ = 0;  // sequence number of the last launch (main thread)
  uint32_t finished_ = 0;   // of the last job the worker finished (under mu_)
  uint32_t tokens_issued_ = 0;    // input tokens handed out (main thread)
  uint32_t tokens_finished_ = 0;  // the last token of the last finished job (under mu_)
  bool stopping_ = false;
  std::thread worker_;  // last: started once every other member exists
};

}  // namespace fsdp
