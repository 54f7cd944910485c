#include "runtime/core/thread_pool.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

namespace fsdp {

ThreadPool::ThreadPool(unsigned threads) {
  for (unsigned t = 1; t < std::max(1u, threads); ++t) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::run_indices() {
  std::unique_lock<std::mutex> lock(mu_);
  ++running_;
  while (next_ < n_) {
    const int64_t i = next_++;
    lock.unlock();
    try {
      (*fn_)(i);
      lock.lock();
    } catch (...) {
      lock.lock();
      if (!failed_) failed_ = std::current_exception();
      next_ = n_;  // skip what is left
    }
  }
  if (--running_ == 0) done_.notify_all();
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_indices();
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    next_ = 0;
    failed_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  run_indices();
  std::exception_ptr failed;
  {
    // Every worker that joined this loop has left it before the loop's state is reused.
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return running_ == 0; });
    failed = failed_;
    fn_ = nullptr;
    n_ = 0;
  }
  if (failed) std::rethrow_exception(failed);
}

unsigned host_threads_per_process(int processes) {
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  CPU_ZERO(&set);
  long allowed = online;
  if (sched_getaffinity(0, sizeof set, &set) == 0) allowed = CPU_COUNT(&set);
  if (allowed >= online && processes > 1) allowed /= processes;
  return unsigned(std::max(1L, allowed));
}

}  // namespace fsdp
