// CommHealth: what every communicator of one World shares about the job's state.
//
// - the training step being run, named in timeout and error messages;
// - the timeout after which a collective that has not finished counts as hung;
// - the first fatal failure (a hung collective, an asynchronous NCCL error, an abort),
//   recorded by whichever thread noticed it (the watchdog, or the main thread polling
//   an MPI request) and raised on the main thread by the next call on any communicator,
//   by Work::synchronize(), or by World::check_health().
//
// Once a failure is recorded the communicators are unusable: NCCL ones have been aborted,
// MPI ones may still hold requests that will never complete. The job is expected to end.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace fsdp {

enum class FailureKind : uint8_t { None, Timeout, CommFailure, Aborted };

class CommHealth {
 public:
  // `on_failure` (optional) is called once with the first failure's message, on the thread
  // that records it, after it is recorded (see WorldOptions::on_failure).
  explicit CommHealth(std::chrono::milliseconds timeout,
                      std::function<void(const std::string&)> on_failure = nullptr)
      : timeout_(timeout), on_failure_(std::move(on_failure)) {}
  CommHealth(const CommHealth&) = delete;
  CommHealth& operator=(const CommHealth&) = delete;

  std::chrono::milliseconds timeout() const { return timeout_; }

  void set_step(int64_t step) { step_.store(step, std::memory_order_relaxed); }
  int64_t step() const { return step_.load(std::memory_order_relaxed); }

  // Records `message` as the job's failure unless one is already recorded (the first
  // failure is the cause; later ones are its consequences). Returns true if it was first.
  bool record_failure(FailureKind kind, const std::string& message);

  bool failed() const { return failed_.load(std::memory_order_acquire); }
  FailureKind failure_kind() const;
  std::string failure_message() const;

  // Throws the recorded failure: TimeoutError for a hung collective, CommError otherwise.
  void raise_if_failed() const {
    if (failed()) raise();
  }

 private:
  [[noreturn]] void raise() const;

  const std::chrono::milliseconds timeout_;
  const std::function<void(const std::string&)> on_failure_;
  std::atomic<int64_t> step_{-1};
  std::atomic<bool> failed_{false};
  mutable std::mutex mu_;
  FailureKind kind_ = FailureKind::None;
  std::string message_;
};

}  // namespace fsdp
