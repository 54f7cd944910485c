#include "collectives/mpi_communicator.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <thread>

#include "collectives/check.h"
#include "collectives/host_reduce.h"

namespace fsdp {
namespace {

// Tag of every point-to-point message: MPI keeps messages between two ranks on one tag in
// order, which is exactly the order of the schedule.
constexpr int kTag = 0;

// How long a wait polls without sleeping, and the longest sleep between polls after that.
constexpr auto kBusyPolling = std::chrono::milliseconds(10);
constexpr auto kMaxPause = std::chrono::microseconds(50);

MPI_Comm returning_errors(MPI_Comm comm) {
  FSDP_CHECK(comm != MPI_COMM_NULL, ValueError, "MpiCommunicator needs a communicator, got MPI_COMM_NULL");
  FSDP_CALL(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  return comm;
}

int comm_rank(MPI_Comm comm) {
  int rank = 0;
  FSDP_CALL(MPI_Comm_rank(returning_errors(comm), &rank));
  return rank;
}

int comm_size(MPI_Comm comm) {
  int size = 0;
  FSDP_CALL(MPI_Comm_size(returning_errors(comm), &size));
  return size;
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name,
                                 std::shared_ptr<CommHealth> health,
                                 std::shared_ptr<ProgressBoard> board)
    : Communicator(std::move(name), comm_rank(comm), comm_size(comm), Device::cpu(),
                   std::move(health)),
      comm_(comm),
      board_(std::move(board)) {
  if (!board_) return;
  // The members' world ranks name them in messages and key this group on the board.
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  FSDP_CALL(MPI_Comm_group(comm_, &group));
  FSDP_CALL(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> ranks(static_cast<size_t>(size()));
  for (int i = 0; i < size(); ++i) ranks[size_t(i)] = i;
  members_.resize(static_cast<size_t>(size()));
  FSDP_CALL(MPI_Group_translate_ranks(group, size(), ranks.data(), world, members_.data()));
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  board_key_ = ProgressBoard::key_of(this->name(), members_);
  board_entry_ = board_->claim(board_key_);
}

MpiCommunicator::~MpiCommunicator() {
  if (mpi_finalized()) return;  // too late to free anything; MPI has released it all
  // Operations still queued in an unfinished group, or abandoned after a timeout, may
  // still be written to by MPI. Free their buffers only if their requests have completed
  // (e.g. the late rank took part after all); otherwise leak them on purpose: the job is
  // ending with an error, and a late write into freed memory would be worse.
  for (auto& op : grouped_) {
    abandoned_requests_.insert(abandoned_requests_.end(), op.requests.begin(),
                               op.requests.end());
    if (op.staging) abandoned_buffers_.push_back(std::move(op.staging));
  }
  if (!abandoned_requests_.empty()) {
    int done = 0;
    if (MPI_Testall(int(abandoned_requests_.size()), abandoned_requests_.data(), &done,
                    MPI_STATUSES_IGNORE) != MPI_SUCCESS ||
        !done) {
      for (auto& buffer : abandoned_buffers_) (void)buffer.release();
    }
  }
  // A communicator with pending operations is only marked for deallocation by MPI.
  MPI_Comm_free(&comm_);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::duplicate(MPI_Comm parent, std::string name,
                                                            std::shared_ptr<CommHealth> health,
                                                            std::shared_ptr<ProgressBoard> board) {
  MPI_Comm comm = MPI_COMM_NULL;
  FSDP_CALL(MPI_Comm_dup(parent, &comm));
  return std::make_unique<MpiCommunicator>(comm, std::move(name), std::move(health),
                                           std::move(board));
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split(std::string name, int color, int key) {
  health()->raise_if_failed();
  FSDP_CHECK(group_depth_ == 0, ValueError, "split of group '", this->name(),
             "' inside group_start()/group_end()");
  MPI_Comm comm = MPI_COMM_NULL;
  FSDP_CALL(MPI_Comm_split(comm_, color, key, &comm));
  return std::make_unique<MpiCommunicator>(comm, std::move(name), health(), board_);
}

void MpiCommunicator::abort(const std::string& reason) {
  health()->record_failure(FailureKind::Aborted,
                           str_cat("communicator '", name(), "' aborted: ", reason));
}

int MpiCommunicator::byte_count(size_t bytes, const std::string& description) const {
  FSDP_CHECK(bytes <= size_t(INT_MAX), ValueError, description, ": ", bytes,
             " bytes per rank exceed what the MPI backend moves in one call (2 GiB)");
  return int(bytes);
}

MpiCommunicator::PendingOp MpiCommunicator::begin(CollectiveKind kind, size_t count,
                                                  DType dtype) {
  PendingOp op;
  op.description = describe(kind, count, dtype);
  op.index = ++started_;
  if (board_) board_->started(board_entry_, started_);
  return op;
}

Work MpiCommunicator::start(PendingOp op) {
  if (group_depth_ > 0) {
    op.work = std::make_shared<WorkState>();
    op.work->health = health();
    Work work(op.work);
    grouped_.push_back(std::move(op));
    return work;
  }
  std::vector<PendingOp> ops;
  ops.push_back(std::move(op));
  complete(std::move(ops));
  return Work();
}

void MpiCommunicator::complete(std::vector<PendingOp> ops) {
  if (ops.empty()) return;
  std::vector<MPI_Request> requests;
  for (const auto& op : ops) requests.insert(requests.end(), op.requests.begin(), op.requests.end());

  // Poll: first by yielding the core between polls, which keeps the transfer progressing at
  // full speed when the other ranks are ready; after a while by sleeping (growing pauses),
  // which leaves the CPU to ranks that are still computing (several may share one core).
  using Clock = std::chrono::steady_clock;
  const auto timeout = health()->timeout();
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  const auto busy_until = start + kBusyPolling;
  auto pause = std::chrono::microseconds(0);
  for (;;) {
    int done = 0;
    FSDP_CALL(MPI_Testall(int(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE));
    if (done) break;
    const auto now = Clock::now();
    // Another thread found the job failed (a staged communicator's worker, the watchdog):
    // the peers of this operation may never come.
    const bool failed_elsewhere = health()->failed();
    if (now >= deadline || failed_elsewhere) {
      abandoned_requests_.insert(abandoned_requests_.end(), requests.begin(), requests.end());
      for (auto& op : ops) {
        if (op.staging) abandoned_buffers_.push_back(std::move(op.staging));
      }
      if (failed_elsewhere) health()->raise_if_failed();
      const std::string what =
          ops.size() == 1 ? ops[0].description
                          : str_cat("a group of ", ops.size(), " operations starting with ",
                                    ops[0].description);
      const std::string who =
          board_ ? board_->laggards(board_key_, ops[0].index, members_) : std::string();
      const std::string message = str_cat(
          what, " did not finish within ",
          std::chrono::duration<double>(timeout).count(), " s: ",
          who.empty() ? "a rank of the group is not taking part (stuck, dead, or issuing "
                        "collectives in a different order)"
                      : who);
      health()->record_failure(FailureKind::Timeout, message);
      throw TimeoutError(message);
    }
    if (now < busy_until) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(std::max(pause * 2, std::chrono::microseconds(10)), kMaxPause);
  }
  for (auto& op : ops) {
    if (op.finish) op.finish();
    if (op.work) op.work->issued = true;
  }
}

Work MpiCommunicator::issue_all_gather(const void* send, void* recv, size_t count_per_rank,
                                       DType dtype, const Stream&) {
  PendingOp op = begin(CollectiveKind::all_gather, count_per_rank, dtype);
  const size_t chunk = count_per_rank * dtype_size(dtype);
  const int n = byte_count(chunk, op.description);
  const bool in_place = send == static_cast<const char*>(recv) + size_t(rank()) * chunk;
  op.requests.resize(1);
  FSDP_CALL(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, MPI_BYTE, recv, n, MPI_BYTE,
                           comm_, &op.requests[0]));
  return start(std::move(op));
}

Work MpiCommunicator::issue_reduce_scatter(const void* send, void* recv, size_t count_per_rank,
                                           DType dtype, ReduceOp reduce, const Stream&,
                                           double prescale) {
  PendingOp op = begin(CollectiveKind::reduce_scatter, count_per_rank, dtype);
  const size_t chunk = count_per_rank * dtype_size(dtype);
  const int n = byte_count(chunk, op.description);
  // Every rank sends chunk j of its input to rank j, which then holds all ranks' copies of
  // its chunk, one after another in rank order, and reduces them.
  op.staging.reset(new unsigned char[std::max<size_t>(chunk * size_t(size()), 1)]);
  unsigned char* staging = op.staging.get();
  op.requests.resize(1);
  FSDP_CALL(MPI_Ialltoall(send, n, MPI_BYTE, staging, n, MPI_BYTE, comm_, &op.requests[0]));
  const int nranks = size();
  op.finish = [=] {
    reduce_in_rank_order(staging, nranks, count_per_rank, dtype, reduce, prescale, recv);
  };
  return start(std::move(op));
}

Work MpiCommunicator::issue_all_reduce(const void* send, void* recv, size_t count, DType dtype,
                                       ReduceOp reduce, const Stream&, double prescale) {
  PendingOp op = begin(CollectiveKind::all_reduce, count, dtype);
  const size_t bytes = count * dtype_size(dtype);
  const int n = byte_count(bytes, op.description);
  // Every rank gathers every rank's whole buffer and reduces it the same way, so all
  // ranks compute bitwise the same result.
  op.staging.reset(new unsigned char[std::max<size_t>(bytes * size_t(size()), 1)]);
  unsigned char* staging = op.staging.get();
  op.requests.resize(1);
  FSDP_CALL(MPI_Iallgather(send, n, MPI_BYTE, staging, n, MPI_BYTE, comm_, &op.requests[0]));
  const int nranks = size();
  op.finish = [=] { reduce_in_rank_order(staging, nranks, count, dtype, reduce, prescale, recv); };
  return start(std::move(op));
}

Work MpiCommunicator::issue_broadcast(void* buf, size_t count, DType dtype, int root,
                                      const Stream&) {
  PendingOp op = begin(CollectiveKind::broadcast, count, dtype);
  const int n = byte_count(count * dtype_size(dtype), op.description);
  op.requests.resize(1);
  FSDP_CALL(MPI_Ibcast(buf, n, MPI_BYTE, root, comm_, &op.requests[0]));
  return start(std::move(op));
}

Work MpiCommunicator::issue_send(const void* buf, size_t count, DType dtype, int peer,
                                 const Stream&) {
  PendingOp op = begin(CollectiveKind::send, count, dtype);
  const int n = byte_count(count * dtype_size(dtype), op.description);
  op.requests.resize(1);
  FSDP_CALL(MPI_Isend(buf, n, MPI_BYTE, peer, kTag, comm_, &op.requests[0]));
  return start(std::move(op));
}

Work MpiCommunicator::issue_recv(void* buf, size_t count, DType dtype, int peer, const Stream&) {
  PendingOp op = begin(CollectiveKind::recv, count, dtype);
  const int n = byte_count(count * dtype_size(dtype), op.description);
  op.requests.resize(1);
  FSDP_CALL(MPI_Irecv(buf, n, MPI_BYTE, peer, kTag, comm_, &op.requests[0]));
  return start(std::move(op));
}

Work MpiCommunicator::issue_all_to_all(const void* send, const std::vector<size_t>& send_counts,
                                       void* recv, const std::vector<size_t>& recv_counts,
                                       DType dtype, const Stream&) {
  size_t sent = 0;
  for (size_t c : send_counts) sent += c;
  PendingOp op = begin(CollectiveKind::all_to_all, sent, dtype);
  // Byte counts and displacements, alive until the operation completes: send counts, send
  // displacements, receive counts, receive displacements.
  const size_t n = send_counts.size(), esize = dtype_size(dtype);
  op.staging.reset(new unsigned char[4 * n * sizeof(int)]);
  int* table = reinterpret_cast<int*>(op.staging.get());
  size_t send_at = 0, recv_at = 0;
  for (size_t p = 0; p < n; ++p) {
    table[p] = byte_count(send_counts[p] * esize, op.description);
    table[n + p] = byte_count(send_at, op.description);
    table[2 * n + p] = byte_count(recv_counts[p] * esize, op.description);
    table[3 * n + p] = byte_count(recv_at, op.description);
    send_at += send_counts[p] * esize;
    recv_at += recv_counts[p] * esize;
  }
  byte_count(send_at, op.description);
  byte_count(recv_at, op.description);
  op.requests.resize(1);
  FSDP_CALL(MPI_Ialltoallv(send, table, table + n, MPI_BYTE, recv, table + 2 * n, table + 3 * n,
                           MPI_BYTE, comm_, &op.requests[0]));
  return start(std::move(op));
}

void MpiCommunicator::issue_barrier() {
  FSDP_CHECK(group_depth_ == 0, ValueError, "barrier on group '", name(),
             "' inside group_start()/group_end()");
  PendingOp op = begin(CollectiveKind::barrier, 0, DType::u8);
  op.requests.resize(1);
  FSDP_CALL(MPI_Ibarrier(comm_, &op.requests[0]));
  start(std::move(op));
}

void MpiCommunicator::issue_group_start() { ++group_depth_; }

void MpiCommunicator::issue_group_end() {
  FSDP_CHECK(group_depth_ > 0, ValueError, "group_end() on group '", name(),
             "' without a matching group_start()");
  if (--group_depth_ > 0) return;
  std::vector<PendingOp> ops = std::move(grouped_);
  grouped_.clear();
  complete(std::move(ops));
}

std::unique_ptr<RegisteredBuffer> MpiCommunicator::issue_register(void*, size_t,
                                                                  BufferRegistration,
                                                                  const std::string&) {
  return nullptr;
}

}  // namespace fsdp
