// Watchdog: a background thread that watches issued collectives (NCCL backend) and ends
// the job when one does not finish within the collective timeout.
//
// Each watched operation comes with a probe ("has it finished?", e.g. a CUDA event query)
// and its description. Every poll interval the thread drops finished operations and looks
// at the oldest unfinished one; once it is older than the timeout, the watchdog records a
// TimeoutError naming the operation, the group and the step in the shared CommHealth, and
// calls the abort hook (ncclCommAbort on every communicator), which also ends the hung
// kernels so that a host blocked on them returns. The next call on the main thread then
// raises the error. Asynchronous communicator errors (ncclCommGetAsyncError) found by the
// error hook are handled the same way.
//
// The owner (the state shared by a World's NCCL communicators) stops and joins the thread
// in its destructor. The MPI backend needs no thread: it polls with a deadline.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "collectives/communicator.h"
#include "collectives/health.h"
#include "runtime/core/device.h"

namespace fsdp {

class Watchdog {
 public:
  struct Hooks {
    // Ends every communicator's work; called once, on the watchdog thread, on failure.
    std::function<void()> abort_all;
    // Returns a non-empty message when a communicator reports an asynchronous error.
    std::function<std::string()> poll_errors;
  };

  // `device`: the CUDA device the probes query (made current on the thread); CPU for none.
  Watchdog(std::shared_ptr<CommHealth> health, Hooks hooks,
           std::chrono::milliseconds poll_interval, Device device = Device::cpu());
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches one issued operation. `finished` runs on the watchdog thread.
  void watch(std::function<bool()> finished, CollectiveInfo info);
  // Operations issued and not yet seen to finish.
  size_t in_flight() const;
  // Whether the watchdog has found a failure (and aborted).
  bool fired() const;

 private:
  struct Entry {
    std::function<bool()> finished;
    CollectiveInfo info;
    std::chrono::steady_clock::time_point issued;
  };

  void run();
  void check_once();
  void fire(FailureKind kind, const std::string& message);

  std::shared_ptr<CommHealth> health_;
  Hooks hooks_;
  std::chrono::milliseconds poll_interval_;
  Device device_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Entry> entries_;  // in issue order
  size_t probing_ = 0;         // entries taken out by the thread for probing
  bool stopping_ = false;
  bool fired_ = false;
  std::thread thread_;  // last: started after every other member exists
};

}  // namespace fsdp
