#include "collectives/staged_communicator.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>

#include "runtime/core/allocator.h"
#include "runtime/core/error.h"

#if FSDP_WITH_CUDA
#include <cuda.h>

#include "runtime/core/cuda_check.h"
#endif

namespace fsdp {
namespace {

// Staging slots are at least this large, and grow in powers of two, so that a step's
// operations reuse a handful of them.
constexpr size_t kMinSlotBytes = size_t(64) << 10;

size_t slot_size_for(size_t bytes) {
  size_t size = kMinSlotBytes;
  while (size < bytes) size *= 2;
  return size;
}

// How the worker waits for an operation's input copy: polling its token, first by yielding
// (the copy is usually about to finish), then with short sleeps.
constexpr auto kBusyPolling = std::chrono::milliseconds(2);
constexpr auto kPause = std::chrono::microseconds(20);

// Input tokens in flight at most (ops issued and not yet finished by the worker): the size
// of the ring of words the streams write them into.
constexpr uint32_t kTokenRing = 1u << 14;

}  // namespace

// ---- Staging: where the bytes wait between the device and MPI

class StagedCommunicator::Staging {
 public:
  struct Slot {
    unsigned char* data = nullptr;
    size_t bytes = 0;
    bool busy = false;
    Event free_after;  // the copies out of it (GPU); empty once it may be reused
  };

  // Slots come from a caching host allocator (pinned on a GPU) and go back to its cache:
  // nothing is freed while the run goes on (a cudaFreeHost waits for the whole device,
  // streams blocked on the worker too).
  explicit Staging(Device device)
      : device_(device),
        memory_(device.is_cuda() ? std::make_unique<PinnedHostAllocator>()
                                 : std::make_unique<HostAllocator>()) {
#if FSDP_WITH_CUDA
    if (device_.is_cuda()) {
      DeviceGuard guard(device_);
      // The words the streams and the worker signal each other with, in mapped host memory:
      // [0] the last operation the worker finished (the streams wait on it), then a ring of
      // input tokens (each stream writes an operation's token once its input is staged).
      // The worker only reads and writes host memory: it makes no CUDA call, so it never
      // waits for a lock a CUDA call of the main thread holds.
      void* words = nullptr;
      const size_t bytes = sizeof(uint32_t) * (1 + kTokenRing);
      FSDP_CALL(cudaHostAlloc(&words, bytes, cudaHostAllocMapped));
      std::memset(words, 0, bytes);
      flag_ = static_cast<uint32_t*>(words);
      void* device_words = nullptr;
      FSDP_CALL(cudaHostGetDevicePointer(&device_words, words, 0));
      device_flag_ = reinterpret_cast<uintptr_t>(device_words);
      // The stream memory operations through the runtime's entry-point lookup: the program
      // then needs no link to libcuda (cudart is linked statically, the driver is found at
      // run time).
      wait_value_ = reinterpret_cast<StreamValue32>(driver_entry("cuStreamWaitValue32"));
      write_value_ = reinterpret_cast<StreamValue32>(driver_entry("cuStreamWriteValue32"));
    }
#endif
  }

  ~Staging() {
    // The streams may still copy out of the slots or wait on the flag: let them finish.
    // Every published flag value has been written by now (the worker has stopped), so
    // this cannot wait forever.
    for (auto& slot : slots_) {
      try {
        slot->free_after.synchronize();
      } catch (const std::exception&) {
        // A failed device: nothing more can be done with the memory than to free it.
      }
      memory_->deallocate(slot->data);
    }
#if FSDP_WITH_CUDA
    if (flag_) cudaFreeHost(flag_);
#endif
  }

  bool on_gpu() const { return device_.is_cuda(); }

  Slot* acquire(size_t bytes) {
    Slot* best = nullptr;
    for (auto& slot : slots_) {
      if (slot->busy || !slot->free_after.query()) continue;
      if (slot->bytes >= bytes && (!best || slot->bytes < best->bytes)) best = slot.get();
    }
    if (!best) {
      // A new slot beside the others (the smaller free ones stay for smaller operations).
      slots_.push_back(std::make_unique<Slot>());
      best = slots_.back().get();
      best->bytes = slot_size_for(bytes);
      DeviceGuard guard(device_);
      best->data = static_cast<unsigned char*>(memory_->allocate(best->bytes, Stream()));
    }
    best->busy = true;
    best->free_after = Event();
    return best;
  }

  // The slot may be reused once `after` (the copies out of it) has completed.
  void release(Slot* slot, Event after) {
    slot->free_after = std::move(after);
    slot->busy = false;
  }

  void copy_in(Slot* slot, const Part& part, const Stream& stream) {
    copy(slot->data + part.at, part.src, part.bytes, stream);
  }

  void copy_out(Slot* slot, const Part& part, const Stream& stream) {
    copy(part.dst, slot->data + part.at, part.bytes, stream);
  }

  // Later work on `stream` waits until the worker has published `seq` (GPU only).
  void wait_published(const Stream& stream, uint32_t seq) {
#if FSDP_WITH_CUDA
    if (device_.is_cuda()) {
      check_driver(wait_value_(stream.cuda_stream(), CUdeviceptr(device_flag_), seq,
                               CU_STREAM_WAIT_VALUE_GEQ),
                   "cuStreamWaitValue32");
    }
#endif
    (void)stream;
    (void)seq;
  }

  // `stream` writes `token` into its ring word once the work queued before it (the input's
  // copy) is done; the write comes after a fence, so the staged bytes are visible first.
  void signal_input(const Stream& stream, uint32_t token) {
#if FSDP_WITH_CUDA
    if (device_.is_cuda()) {
      const uintptr_t word = device_flag_ + sizeof(uint32_t) * (1 + token % kTokenRing);
      check_driver(write_value_(stream.cuda_stream(), CUdeviceptr(word), token,
                                CU_STREAM_WRITE_VALUE_DEFAULT),
                   "cuStreamWriteValue32");
    }
#endif
    (void)stream;
    (void)token;
  }

  // Whether the stream has written `token` (worker thread; host memory only).
  bool input_ready(uint32_t token) const {
    if (!flag_) return true;
    return __atomic_load_n(flag_ + 1 + token % kTokenRing, __ATOMIC_ACQUIRE) == token;
  }

  // Lets every stream waiting for a value up to `seq` go on (worker thread).
  // Never moves the flag back (the destructor may publish the last queued value while the
  // worker finishes an earlier one).
  void publish(uint32_t seq) {
    if (!flag_) return;
    uint32_t current = __atomic_load_n(flag_, __ATOMIC_ACQUIRE);
    while (int32_t(seq - current) > 0 &&
           !__atomic_compare_exchange_n(flag_, &current, seq, false, __ATOMIC_RELEASE,
                                        __ATOMIC_ACQUIRE)) {
    }
  }

 private:
  // Between the caller's buffer (device or host) and a slot: queued on `stream` on a GPU,
  // at once on the CPU.
  void copy(void* dst, const void* src, size_t bytes, const Stream& stream) const {
    if (bytes == 0) return;
#if FSDP_WITH_CUDA
    if (device_.is_cuda()) {
      FSDP_CALL(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream.cuda_stream()));
      return;
    }
#endif
    (void)stream;
    std::memcpy(dst, src, bytes);
  }

#if FSDP_WITH_CUDA
  static void* driver_entry(const char* name) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    FSDP_CALL(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found));
    FSDP_CHECK(found == cudaDriverEntryPointSuccess && fn != nullptr, DeviceError,
               "the staged backend needs ", name, ", which this CUDA driver does not provide ",
               "(lookup status ", int(found), ")");
    return fn;
  }

  static void check_driver(CUresult status, const char* what) {
    FSDP_CHECK(status == CUDA_SUCCESS, CudaError, what, " failed with CUresult ", int(status),
               " (the staged backend needs stream memory operations)");
  }
#endif

  Device device_;
  std::unique_ptr<HostAllocator> memory_;
  std::vector<std::unique_ptr<Slot>> slots_;
  uint32_t* flag_ = nullptr;  // [0] published, then the token ring (GPU only)
#if FSDP_WITH_CUDA
  using StreamValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  uintptr_t device_flag_ = 0;
  StreamValue32 wait_value_ = nullptr;
  StreamValue32 write_value_ = nullptr;
#endif
};

// ---- the communicator

StagedCommunicator::StagedCommunicator(std::unique_ptr<MpiCommunicator> host, Device device)
    : Communicator(host->name(), host->rank(), host->size(), device, host->health()),
      host_(std::move(host)),
      staging_(std::make_unique<Staging>(device)) {
  worker_ = std::thread([this] { run_worker(); });
}

StagedCommunicator::~StagedCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    // Unwinding an error: the operations not yet started are dropped rather than waited
    // for (their peers may never come); the one in progress ends or times out.
    if (std::uncaught_exceptions() > 0) {
      for (Job& job : queue_) staging_->publish(job.seq);
      queue_.clear();
    }
  }
  work_ready_.notify_all();
  worker_.join();
  staging_.reset();  // waits for the streams to be done with the slots
}

std::unique_ptr<StagedCommunicator> StagedCommunicator::split(std::string name, int color,
                                                              int key) {
  // The split is an MPI call on the host communicator from this thread: the worker must not
  // be inside one at the same time.
  drain();
  return std::make_unique<StagedCommunicator>(host_->split(std::move(name), color, key),
                                              device());
}

void StagedCommunicator::abort(const std::string& reason) {
  health()->record_failure(FailureKind::Aborted,
                           str_cat("communicator '", name(), "' aborted: ", reason));
  work_ready_.notify_all();
}

void StagedCommunicator::drain() {
  wait_finished(submitted_);
  health()->raise_if_failed();
}

void StagedCommunicator::wait_finished(uint32_t seq) {
  std::unique_lock<std::mutex> lock(mu_);
  // Cyclic comparison, as the streams' wait: sequence numbers wrap after 2^32 operations.
  job_finished_.wait(lock, [&] { return int32_t(finished_ - seq) >= 0; });
}

// ---- the worker

void StagedCommunicator::run_worker() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, with nothing left to do
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    run_job(job);
    // Published whatever happened: after a failure the streams go on (with whatever the
    // outputs hold) rather than wait forever, and the main thread raises the failure.
    staging_->publish(job.seq);
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = job.seq;
      if (!job.inputs.empty()) tokens_finished_ = job.inputs.back();
    }
    job_finished_.notify_all();
  }
}

void StagedCommunicator::run_job(Job& job) {
  // Once the job has failed, operations are skipped: their peers may be gone.
  if (health()->failed()) return;
  try {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    const auto deadline = start + health()->timeout();
    for (uint32_t token : job.inputs) {
      while (!staging_->input_ready(token)) {
        if (health()->failed()) return;
        const auto now = Clock::now();
        if (now >= deadline) {
          const std::string message =
              str_cat(job.description, ": this rank's stream did not reach the operation within ",
                      std::chrono::duration<double>(health()->timeout()).count(),
                      " s (its earlier work on that stream never finished)");
          health()->record_failure(FailureKind::Timeout, message);
          return;
        }
        if (now - start < kBusyPolling) {
          std::this_thread::yield();
        } else {
          std::this_thread::sleep_for(kPause);
        }
      }
    }
    if (job.moves.size() == 1) {
      job.moves[0]();
    } else {
      host_->group_start();
      for (auto& move : job.moves) move();
      host_->group_end();
    }
  } catch (const std::exception& e) {
    // A timeout was recorded by the MPI side already (record_failure keeps the first).
    health()->record_failure(FailureKind::CommFailure,
                             str_cat(job.description, " failed: ", e.what()));
  }
}

// ---- issuing

StagedCommunicator::Op StagedCommunicator::make_op(CollectiveKind kind, size_t count, DType dtype,
                                                   const Stream& stream) const {
  Op op;
  op.description = describe(kind, count, dtype);
  op.stream = stream;
  return op;
}

Work StagedCommunicator::issue(Op op) {
  op.work = std::make_shared<WorkState>();
  op.work->health = health();
  Work work(op.work);
  if (group_depth_ > 0) {
    grouped_.push_back(std::move(op));
    return work;
  }
  std::vector<Op> ops;
  ops.push_back(std::move(op));
  launch(std::move(ops));
  return work;
}

void StagedCommunicator::launch(std::vector<Op> ops) {
  if (ops.empty()) return;
  DeviceGuard guard(device());
  Job job;
  job.seq = submitted_ + 1;
  job.description = ops.size() == 1 ? ops[0].description
                                    : str_cat("a group of ", ops.size(),
                                              " operations starting with ", ops[0].description);
  if (staging_->on_gpu()) {
    // The ring holds the tokens of the operations the worker has not finished: wait for it
    // to catch up before this launch's tokens could overwrite one it still reads.
    std::unique_lock<std::mutex> lock(mu_);
    job_finished_.wait(lock, [&] {
      return tokens_issued_ + uint32_t(ops.size()) - tokens_finished_ < kTokenRing;
    });
  }
  std::vector<Staging::Slot*> slots;
  for (Op& op : ops) {
    Staging::Slot* slot = staging_->acquire(std::max<size_t>(op.slot_bytes, 1));
    slots.push_back(slot);
    for (const Part& part : op.ins) staging_->copy_in(slot, part, op.stream);
    if (staging_->on_gpu()) {
      const uint32_t token = ++tokens_issued_;
      staging_->signal_input(op.stream, token);
      job.inputs.push_back(token);
    }
    unsigned char* data = slot->data;
    MpiCommunicator* host = host_.get();
    auto move = op.move;
    job.moves.push_back([host, data, move] { move(*host, data); });
  }
  submitted_ = job.seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
  }
  work_ready_.notify_one();

  const uint32_t seq = submitted_;
  if (!device().is_cuda()) {
    // CPU: finished when issued, as on every CPU stream; a failure is raised here.
    wait_finished(seq);
    health()->raise_if_failed();
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    Op& op = ops[i];
    staging_->wait_published(op.stream, seq);
    for (const Part& part : op.outs) staging_->copy_out(slots[i], part, op.stream);
    Event done;
    if (op.stream.is_cuda()) {
      done = Event::create(device());
      done.record(op.stream);
    }
    op.work->done = done;
    op.work->issued = true;
    staging_->release(slots[i], done);
  }
}

Work StagedCommunicator::issue_all_gather(const void* send, void* recv, size_t count_per_rank,
                                          DType dtype, const Stream& stream) {
  Op op = make_op(CollectiveKind::all_gather, count_per_rank, dtype, stream);
  const size_t chunk = count_per_rank * dtype_size(dtype);
  const size_t total = chunk * size_t(size());
  op.slot_bytes = chunk + total;
  op.ins = {Part{send, nullptr, 0, chunk}};
  op.outs = {Part{nullptr, recv, chunk, total}};
  op.move = [=](MpiCommunicator& host, unsigned char* slot) {
    host.all_gather(slot, slot + chunk, count_per_rank, dtype, Stream::cpu());
  };
  return issue(std::move(op));
}

Work StagedCommunicator::issue_reduce_scatter(const void* send, void* recv, size_t count_per_rank,
                                              DType dtype, ReduceOp reduce, const Stream& stream,
                                              double prescale) {
  Op op = make_op(CollectiveKind::reduce_scatter, count_per_rank, dtype, stream);
  const size_t chunk = count_per_rank * dtype_size(dtype);
  const size_t total = chunk * size_t(size());
  op.slot_bytes = total + chunk;
  op.ins = {Part{send, nullptr, 0, total}};
  op.outs = {Part{nullptr, recv, total, chunk}};
  op.move = [=](MpiCommunicator& host, unsigned char* slot) {
    host.reduce_scatter(slot, slot + total, count_per_rank, dtype, reduce, Stream::cpu(),
                        prescale);
  };
  return issue(std::move(op));
}

Work StagedCommunicator::issue_all_reduce(const void* send, void* recv, size_t count, DType dtype,
                                          ReduceOp reduce, const Stream& stream,
                                          double prescale) {
  Op op = make_op(CollectiveKind::all_reduce, count, dtype, stream);
  const size_t bytes = count * dtype_size(dtype);
  op.slot_bytes = 2 * bytes;
  op.ins = {Part{send, nullptr, 0, bytes}};
  op.outs = {Part{nullptr, recv, bytes, bytes}};
  op.move = [=](MpiCommunicator& host, unsigned char* slot) {
    host.all_reduce(slot, slot + bytes, count, dtype, reduce, Stream::cpu(), prescale);
  };
  return issue(std::move(op));
}

Work StagedCommunicator::issue_broadcast(void* buf, size_t count, DType dtype, int root,
                                         const Stream& stream) {
  Op op = make_op(CollectiveKind::broadcast, count, dtype, stream);
  const size_t bytes = count * dtype_size(dtype);
  op.slot_bytes = bytes;
  // Only the root's bytes travel; every rank's buffer is overwritten with them (the root's
  // with its own).
  if (rank() == root) op.ins = {Part{buf, nullptr, 0, bytes}};
  op.outs = {Part{nullptr, buf, 0, bytes}};
  op.move = [=](MpiCommunicator& host, unsigned char* slot) {
    host.broadcast(slot, count, dtype, root, Stream::cpu());
  };
  return issue(std::move(op));
}

Work StagedCommunicator::issue_send(const void* buf, size_t count, DType dtype, int peer,
                                    const Stream& stream) {
  Op op = make_op(CollectiveKind::send, count, dtype, stream);
  const size_t bytes = count * dtype_size(dtype);
  op.slot_bytes = bytes;
  op.ins = {Part{buf, nullptr, 0, bytes}};
  op.move = [=](MpiCommunicator& host, unsigned char* slot) {
    host.send(slot, count, dtype, peer, Stream::cpu());
  };
  return issue(std::move(op));
}

Work StagedCommunicator::issue_recv(void* buf, size_t count, DType dtype, int peer,
                                    const Stream& stream) {
  Op op = make_op(CollectiveKind::recv, count, dtype, stream);
  const size_t bytes = count * dtype_size(dtype);
  op.slot_bytes = bytes;
  op.outs = {Part{nullptr, buf, 0, bytes}};
  op.move = [=](MpiCommunicator& host, unsigned char* slot) {
    host.recv(slot, count, dtype, peer, Stream::cpu());
  };
  return issue(std::move(op));
}

Work StagedCommunicator::issue_all_to_all(const void* send, const std::vector<size_t>& send_counts,
                                          void* recv, const std::vector<size_t>& recv_counts,
                                          DType dtype, const Stream& stream) {
  size_t sent = 0, received = 0;
  for (size_t c : send_counts) sent += c;
  for (size_t c : recv_counts) received += c;
  Op op = make_op(CollectiveKind::all_to_all, sent, dtype, stream);
  const size_t esize = dtype_size(dtype);
  const size_t in_bytes = sent * esize, out_bytes = received * esize;
  op.slot_bytes = in_bytes + out_bytes;
  op.ins = {Part{send, nullptr, 0, in_bytes}};
  op.outs = {Part{nullptr, recv, in_bytes, out_bytes}};
  op.move = [=](MpiCommunicator& host, unsigned char* slot) {
    host.all_to_all(slot, send_counts, slot + in_bytes, recv_counts, dtype, Stream::cpu());
  };
  return issue(std::move(op));
}

void StagedCommunicator::issue_barrier() {
  FSDP_CHECK(group_depth_ == 0, ValueError, "barrier on group '", name(),
             "' inside group_start()/group_end()");
  // The worker is idle once every issued operation has finished: the barrier is then an MPI
  // call of this thread alone.
  drain();
  host_->barrier();
}

std::unique_ptr<RegisteredBuffer> StagedCommunicator::issue_register(void*, size_t,
                                                                     BufferRegistration,
                                                                     const std::string&) {
  return nullptr;
}

void StagedCommunicator::issue_group_start() { ++group_depth_; }

void StagedCommunicator::issue_group_end() {
  FSDP_CHECK(group_depth_ > 0, ValueError, "group_end() on group '", name(),
             "' without a matching group_start()");
  if (--group_depth_ > 0) return;
  std::vector<Op> ops = std::move(grouped_);
  grouped_.clear();
  launch(std::move(ops));
}

}  // namespace fsdp
