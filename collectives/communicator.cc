#include "collectives/communicator.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "runtime/core/error.h"

namespace fsdp {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::all_gather: return "all_gather";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::all_reduce: return "all_reduce";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::send: return "send";
    case CollectiveKind::recv: return "recv";
    case CollectiveKind::barrier: return "barrier";
    case CollectiveKind::all_to_all: return "all_to_all";
  }
  return "?";
}

const char* buffer_registration_name(BufferRegistration kind) {
  switch (kind) {
    case BufferRegistration::local: return "local";
    case BufferRegistration::symmetric: return "symmetric";
  }
  return "?";
}

BufferRegistration buffer_registration_from_name(const std::string& name) {
  if (name == "local") return BufferRegistration::local;
  if (name == "symmetric") return BufferRegistration::symmetric;
  FSDP_THROW(ConfigError, "unknown buffer registration '", name, "' (local | symmetric)");
}

std::string CollectiveInfo::str() const {
  std::string what = collective_name(kind);
  if (kind != CollectiveKind::barrier) what += str_cat(" of ", count, " x ", dtype_name(dtype));
  return str_cat(what, " on group '", group, "' (rank ", rank, " of ", size, ") at step ", step);
}

// ---- Work

void Work::check_issued(const char* what) const {
  FSDP_CHECK(state_->issued, ValueError, "Work::", what,
             "() on an operation issued inside group_start(): call group_end() first");
}

void Work::wait(const Stream& stream) const {
  if (!state_) return;
  check_issued("wait");
  stream.wait(state_->done);
}

void Work::synchronize() const {
  if (!state_) return;
  check_issued("synchronize");
  // Poll rather than block inside CUDA: if a peer never joins, the watchdog records the
  // failure (and aborts the communicator), and this thread raises it whether or not the
  // aborted kernel ever lets the event complete.
  while (!state_->done.query()) {
    if (state_->health) state_->health->raise_if_failed();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (state_->health) state_->health->raise_if_failed();
}

bool Work::done() const {
  if (!state_) return true;
  return state_->issued && state_->done.query();
}

// ---- Communicator

namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

uint64_t fnv_mix(uint64_t hash, uint64_t value) {
  for (int i = 0; i < 8; ++i) {
    hash ^= (value >> (8 * i)) & 0xffu;
    hash *= kFnvPrime;
  }
  return hash;
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

bool is_integral_value(double v) { return std::isfinite(v) && std::floor(v) == v; }

}  // namespace

Communicator::Communicator(std::string name, int rank, int size, Device device,
                           std::shared_ptr<CommHealth> health)
    : name_(std::move(name)), rank_(rank), size_(size), device_(device),
      health_(std::move(health)), hash_(kFnvOffset) {
  FSDP_ASSERT(health_ != nullptr);
  FSDP_ASSERT(size_ >= 1 && rank_ >= 0 && rank_ < size_, "rank ", rank_, " of ", size_);
}

CollectiveInfo Communicator::info(CollectiveKind kind, size_t count, DType dtype) const {
  CollectiveInfo out;
  out.kind = kind;
  out.count = count;
  out.dtype = dtype;
  out.group = name_;
  out.rank = rank_;
  out.size = size_;
  out.step = health_->step();
  return out;
}

void Communicator::check_stream(const Stream& stream, CollectiveKind kind) const {
  FSDP_CHECK(stream.device() == device_, DeviceError, collective_name(kind), " on group '",
             name_, "': the stream is on ", stream.device().str(), " but the communicator on ",
             device_.str());
}

void Communicator::check_reduction(CollectiveKind kind, DType dtype, ReduceOp op,
                                   double prescale) const {
  if (prescale == 1.0) return;
  FSDP_CHECK(std::isfinite(prescale), ValueError, collective_name(kind), " on group '", name_,
             "': prescale must be finite, got ", prescale);
  FSDP_CHECK(op == ReduceOp::Sum || op == ReduceOp::Avg, ValueError, collective_name(kind),
             " on group '", name_, "': prescale applies to sum and avg only, not ",
             reduce_op_name(op));
  FSDP_CHECK(is_floating(dtype) || is_integral_value(prescale), ValueError,
             collective_name(kind), " on group '", name_, "': prescale ", prescale,
             " is not a whole number, which ", dtype_name(dtype), " cannot represent");
}

void Communicator::record(CollectiveKind kind, size_t count, DType dtype, ReduceOp op, int root,
                          uint64_t bytes) {
  switch (kind) {
    case CollectiveKind::all_gather: ++counts_.all_gather; break;
    case CollectiveKind::reduce_scatter: ++counts_.reduce_scatter; break;
    case CollectiveKind::all_reduce: ++counts_.all_reduce; break;
    case CollectiveKind::broadcast: ++counts_.broadcast; break;
    case CollectiveKind::send: ++counts_.send; break;
    case CollectiveKind::recv: ++counts_.recv; break;
    case CollectiveKind::barrier: ++counts_.barrier; break;
    case CollectiveKind::all_to_all: ++counts_.all_to_all; break;
  }
  counts_.bytes += bytes;
  // Peers of send/recv differ between ranks by design, so they stay out of the hash.
  hash_ = fnv_mix(hash_, uint64_t(kind));
  hash_ = fnv_mix(hash_, uint64_t(count));
  hash_ = fnv_mix(hash_, uint64_t(dtype));
  hash_ = fnv_mix(hash_, uint64_t(op));
  hash_ = fnv_mix(hash_, uint64_t(int64_t(root)));
}

Work Communicator::all_gather(const void* send, void* recv, size_t count_per_rank, DType dtype,
                              const Stream& stream) {
  const CollectiveKind kind = CollectiveKind::all_gather;
  health_->raise_if_failed();
  check_stream(stream, kind);
  const size_t chunk = count_per_rank * dtype_size(dtype);
  const size_t total = chunk * size_t(size_);
  if (count_per_rank > 0) {
    FSDP_CHECK(send && recv, ValueError, describe(kind, count_per_rank, dtype), ": null buffer");
    const void* in_place = static_cast<const char*>(recv) + size_t(rank_) * chunk;
    FSDP_CHECK(send == in_place || !overlaps(send, chunk, recv, total), ValueError,
               describe(kind, count_per_rank, dtype),
               ": send and recv overlap; in place needs send == recv + rank * count");
  }
  Work work = issue_all_gather(send, recv, count_per_rank, dtype, stream);
  record(kind, count_per_rank, dtype, ReduceOp::Sum, -1, total);
  return work;
}

Work Communicator::reduce_scatter(const void* send, void* recv, size_t count_per_rank,
                                  DType dtype, ReduceOp op, const Stream& stream,
                                  double prescale) {
  const CollectiveKind kind = CollectiveKind::reduce_scatter;
  health_->raise_if_failed();
  check_stream(stream, kind);
  check_reduction(kind, dtype, op, prescale);
  const size_t chunk = count_per_rank * dtype_size(dtype);
  const size_t total = chunk * size_t(size_);
  if (count_per_rank > 0) {
    FSDP_CHECK(send && recv, ValueError, describe(kind, count_per_rank, dtype), ": null buffer");
    const void* in_place = static_cast<const char*>(send) + size_t(rank_) * chunk;
    FSDP_CHECK(recv == in_place || !overlaps(send, total, recv, chunk), ValueError,
               describe(kind, count_per_rank, dtype),
               ": send and recv overlap; in place needs recv == send + rank * count");
  }
  Work work = issue_reduce_scatter(send, recv, count_per_rank, dtype, op, stream, prescale);
  record(kind, count_per_rank, dtype, op, -1, total);
  return work;
}

Work Communicator::all_reduce(const void* send, void* recv, size_t count, DType dtype,
                              ReduceOp op, const Stream& stream, double prescale) {
  const CollectiveKind kind = CollectiveKind::all_reduce;
  health_->raise_if_failed();
  check_stream(stream, kind);
  check_reduction(kind, dtype, op, prescale);
  const size_t bytes = count * dtype_size(dtype);
  if (count > 0) {
    FSDP_CHECK(send && recv, ValueError, describe(kind, count, dtype), ": null buffer");
    FSDP_CHECK(send == recv || !overlaps(send, bytes, recv, bytes), ValueError,
               describe(kind, count, dtype), ": send and recv overlap without being equal");
  }
  Work work = issue_all_reduce(send, recv, count, dtype, op, stream, prescale);
  record(kind, count, dtype, op, -1, bytes);
  return work;
}

Work Communicator::broadcast(void* buf, size_t count, DType dtype, int root,
                             const Stream& stream) {
  const CollectiveKind kind = CollectiveKind::broadcast;
  health_->raise_if_failed();
  check_stream(stream, kind);
  FSDP_CHECK(root >= 0 && root < size_, IndexError, describe(kind, count, dtype), ": root ",
             root, " is not a rank of this group of ", size_);
  FSDP_CHECK(count == 0 || buf, ValueError, describe(kind, count, dtype), ": null buffer");
  Work work = issue_broadcast(buf, count, dtype, root, stream);
  record(kind, count, dtype, ReduceOp::Sum, root, count * dtype_size(dtype));
  return work;
}

Work Communicator::send(const void* buf, size_t count, DType dtype, int peer,
                        const Stream& stream) {
  const CollectiveKind kind = CollectiveKind::send;
  health_->raise_if_failed();
  check_stream(stream, kind);
  FSDP_CHECK(peer >= 0 && peer < size_, IndexError, describe(kind, count, dtype), ": peer ",
             peer, " is not a rank of this group of ", size_);
  FSDP_CHECK(count == 0 || buf, ValueError, describe(kind, count, dtype), ": null buffer");
  Work work = issue_send(buf, count, dtype, peer, stream);
  record(kind, count, dtype, ReduceOp::Sum, -1, count * dtype_size(dtype));
  return work;
}

Work Communicator::recv(void* buf, size_t count, DType dtype, int peer, const Stream& stream) {
  const CollectiveKind kind = CollectiveKind::recv;
  health_->raise_if_failed();
  check_stream(stream, kind);
  FSDP_CHECK(peer >= 0 && peer < size_, IndexError, describe(kind, count, dtype), ": peer ",
             peer, " is not a rank of this group of ", size_);
  FSDP_CHECK(count == 0 || buf, ValueError, describe(kind, count, dtype), ": null buffer");
  Work work = issue_recv(buf, count, dtype, peer, stream);
  record(kind, count, dtype, ReduceOp::Sum, -1, count * dtype_size(dtype));
  return work;
}

Work Communicator::all_to_all(const void* send, const std::vector<size_t>& send_counts,
                              void* recv, const std::vector<size_t>& recv_counts, DType dtype,
                              const Stream& stream) {
  const CollectiveKind kind = CollectiveKind::all_to_all;
  health_->raise_if_failed();
  check_stream(stream, kind);
  FSDP_CHECK(send_counts.size() == size_t(size_) && recv_counts.size() == size_t(size_),
             ValueError, collective_name(kind), " on group '", name_, "': ", send_counts.size(),
             " send and ", recv_counts.size(), " receive counts for ", size_, " ranks");
  size_t sent = 0, received = 0;
  for (size_t c : send_counts) sent += c;
  for (size_t c : recv_counts) received += c;
  const size_t esize = dtype_size(dtype);
  FSDP_CHECK((sent == 0 || send) && (received == 0 || recv), ValueError,
             describe(kind, sent, dtype), ": null buffer");
  FSDP_CHECK(!overlaps(send, sent * esize, recv, received * esize), ValueError,
             describe(kind, sent, dtype), ": the send and receive buffers overlap");
  Work work = issue_all_to_all(send, send_counts, recv, recv_counts, dtype, stream);
  // Only the kind and dtype enter the hash (record's count and root are constant here).
  record(kind, 0, dtype, ReduceOp::Sum, -1, sent * esize);
  return work;
}

void Communicator::barrier() {
  health_->raise_if_failed();
  issue_barrier();
  record(CollectiveKind::barrier, 0, DType::u8, ReduceOp::Sum, -1, 0);
}

void Communicator::group_start() {
  health_->raise_if_failed();
  issue_group_start();
}

void Communicator::group_end() {
  health_->raise_if_failed();
  issue_group_end();
}

// ---- buffer registration

Registration Communicator::register_buffer(void* data, size_t bytes, BufferRegistration kind,
                                           const std::string& what) {
  health_->raise_if_failed();
  FSDP_CHECK(data != nullptr && bytes > 0, ValueError, "registering ", what, " with group '",
             name_, "' (rank ", rank_, " of ", size_, "): empty buffer (", bytes, " bytes at ",
             data, ")");
  std::unique_ptr<RegisteredBuffer> impl = issue_register(data, bytes, kind, what);
  if (!impl) return Registration();
  return Registration(std::move(impl), data, bytes, kind);
}

Registration Communicator::register_buffer(const Tensor& t, BufferRegistration kind,
                                           const std::string& what) {
  FSDP_CHECK(t.defined(), ValueError, "registering ", what, " with group '", name_,
             "': the tensor is undefined");
  FSDP_CHECK(t.device() == device_, DeviceError, "registering ", what, " with group '", name_,
             "': ", t.str(), " is not on the communicator's device ", device_.str());
  FSDP_CHECK(t.is_contiguous(), ShapeError, "registering ", what, " with group '", name_,
             "': ", t.str(), " must be contiguous");
  return register_buffer(t.data_ptr(), t.nbytes(), kind, what);
}

// ---- tensor forms

void Communicator::check_tensor(const Tensor& t, CollectiveKind kind, const char* role) const {
  FSDP_CHECK(t.defined(), ValueError, collective_name(kind), " on group '", name_, "': the ",
             role, " tensor is undefined");
  FSDP_CHECK(t.device() == device_, DeviceError, collective_name(kind), " on group '", name_,
             "': the ", role, " tensor ", t.str(), " is not on the communicator's device ",
             device_.str());
  FSDP_CHECK(t.is_contiguous(), ShapeError, collective_name(kind), " on group '", name_,
             "': the ", role, " tensor ", t.str(), " must be contiguous");
}

void Communicator::check_split(CollectiveKind kind, const Tensor& whole, const char* whole_role,
                               const Tensor& part, const char* part_role) const {
  check_tensor(whole, kind, whole_role);
  check_tensor(part, kind, part_role);
  check_same_dtype(whole, part, collective_name(kind));
  FSDP_CHECK(whole.numel() % size_ == 0, ShapeError, collective_name(kind), " on group '", name_,
             "': the ", whole_role, " of ", whole.numel(), " elements does not divide evenly ",
             "among ", size_, " ranks; the caller must pad it to a multiple of ", size_);
  FSDP_CHECK(whole.numel() == part.numel() * size_, ShapeError, collective_name(kind),
             " on group '", name_, "': the ", whole_role, " has ", whole.numel(),
             " elements, expected ", part_role, " ", part.numel(), " x ", size_, " ranks = ",
             part.numel() * size_);
}

Work Communicator::all_gather(const Tensor& out, const Tensor& in, const Stream& stream) {
  check_split(CollectiveKind::all_gather, out, "output", in, "input");
  return all_gather(in.data_ptr(), out.data_ptr(), size_t(in.numel()), in.dtype(), stream);
}

Work Communicator::reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op,
                                  const Stream& stream, double prescale) {
  check_split(CollectiveKind::reduce_scatter, in, "input", out, "output");
  return reduce_scatter(in.data_ptr(), out.data_ptr(), size_t(out.numel()), in.dtype(), op,
                        stream, prescale);
}

Work Communicator::all_reduce(const Tensor& t, ReduceOp op, const Stream& stream,
                              double prescale) {
  check_tensor(t, CollectiveKind::all_reduce, "buffer");
  return all_reduce(t.data_ptr(), t.data_ptr(), size_t(t.numel()), t.dtype(), op, stream,
                    prescale);
}

Work Communicator::broadcast(const Tensor& t, int root, const Stream& stream) {
  check_tensor(t, CollectiveKind::broadcast, "buffer");
  return broadcast(t.data_ptr(), size_t(t.numel()), t.dtype(), root, stream);
}

}  // namespace fsdp
