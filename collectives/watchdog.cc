#include "collectives/watchdog.h"

#include <cstdio>
#include <exception>
#include <vector>

#include "runtime/core/stream.h"

namespace fsdp {

Watchdog::Watchdog(std::shared_ptr<CommHealth> health, Hooks hooks,
                   std::chrono::milliseconds poll_interval, Device device)
    : health_(std::move(health)), hooks_(std::move(hooks)), poll_interval_(poll_interval),
      device_(device) {
  FSDP_ASSERT(health_ != nullptr);
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Watchdog::watch(std::function<bool()> finished, CollectiveInfo info) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fired_) return;
  entries_.push_back(Entry{std::move(finished), std::move(info), std::chrono::steady_clock::now()});
}

size_t Watchdog::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size() + probing_;
}

bool Watchdog::fired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fired_;
}

void Watchdog::run() {
  try {
    // Probes query CUDA events of this device; make it current on this thread.
    DeviceGuard guard(device_);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      wake_.wait_for(lock, poll_interval_, [this] { return stopping_; });
      if (stopping_ || fired_) continue;
      lock.unlock();
      check_once();
      lock.lock();
    }
  } catch (const std::exception& e) {
    // Nothing may escape a thread; a watchdog that cannot run must not fail silently.
    fire(FailureKind::CommFailure, str_cat("collective watchdog failed: ", e.what()));
  }
}

void Watchdog::check_once() {
  if (hooks_.poll_errors) {
    std::string error = hooks_.poll_errors();
    if (!error.empty()) {
      fire(FailureKind::CommFailure, error);
      return;
    }
  }
  // Probe outside the lock so that the main thread never waits for the probes.
  std::deque<Entry> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(entries_);
    probing_ = batch.size();
  }
  std::deque<Entry> unfinished;
  std::string failure;
  FailureKind kind = FailureKind::None;
  const auto now = std::chrono::steady_clock::now();
  for (auto& entry : batch) {
    bool finished = false;
    try {
      finished = entry.finished();
    } catch (const std::exception& e) {
      kind = FailureKind::CommFailure;
      failure = str_cat(entry.info.str(), " failed: ", e.what());
      break;
    }
    if (finished) continue;
    if (now - entry.issued > health_->timeout()) {
      kind = FailureKind::Timeout;
      failure = str_cat(entry.info.str(), " did not finish within ",
                        std::chrono::duration<double>(health_->timeout()).count(),
                        " s: a rank of the group is not taking part (stuck, dead, or issuing "
                        "collectives in a different order); the watchdog aborted the "
                        "communicators");
      break;
    }
    unfinished.push_back(std::move(entry));
  }
  if (kind != FailureKind::None) {
    fire(kind, failure);
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  // Operations issued while probing were appended to entries_; keep issue order.
  for (auto it = unfinished.rbegin(); it != unfinished.rend(); ++it) {
    entries_.push_front(std::move(*it));
  }
  probing_ = 0;
}

void Watchdog::fire(FailureKind kind, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (fired_) return;
    fired_ = true;
    entries_.clear();
    probing_ = 0;
  }
  // Say it at once: the main thread may be busy elsewhere for a while before it raises it.
  if (health_->record_failure(kind, message)) {
    std::fprintf(stderr, "collective watchdog: %s\n", message.c_str());
    std::fflush(stderr);
  }
  if (hooks_.abort_all) {
    try {
      hooks_.abort_all();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "collective watchdog: aborting the communicators failed: %s\n",
                   e.what());
    }
  }
}

}  // namespace fsdp
