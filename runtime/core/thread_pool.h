// ThreadPool: a fixed set of worker threads that run one parallel loop at a time.
//
// parallel_for(n, fn) calls fn(i) for every i in [0, n) on the workers and the calling
// thread, and returns when all calls have returned. The first exception thrown by any call
// is rethrown in the caller once the loop has drained (the remaining indices are skipped).
// Used where the host does bulk elementwise work (the CPU-offloaded optimizer); the threads
// live as long as the pool, so a loop costs no thread creation.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fsdp {

class ThreadPool {
 public:
  // `threads` workers in all, the calling thread included (at least 1).
  explicit ThreadPool(unsigned threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned size() const { return unsigned(workers_.size()) + 1; }
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  void worker_loop();
  void run_indices();  // claims and runs indices of the current loop until none are left

  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, next_ = 0, running_ = 0;
  uint64_t generation_ = 0;  // counts loops, so a worker joins each loop once
  std::exception_ptr failed_;
  bool stop_ = false;
};

// Threads one of `processes` processes on this host should use for bulk host work: the
// CPUs this process may run on (its affinity), shared evenly among the processes when each
// may run on every CPU (not bound by the launcher). At least 1.
unsigned host_threads_per_process(int processes);

}  // namespace fsdp
