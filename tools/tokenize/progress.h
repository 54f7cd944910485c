// The progress line of a long tokenize job: bytes done of the total, tokens per second and
// the time left, printed to a stream from a thread of its own while workers report.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

namespace fsdp::tokenize {

// "12.3 / 40.2 MB (30.6%) | 1.05 M tokens/s | ETA 0:00:27"
std::string progress_text(uint64_t bytes_done, uint64_t bytes_total, uint64_t tokens,
                          double seconds);

class ProgressLine {
 public:
  // Silent for the first `quiet_seconds` (short jobs print nothing); then a line every
  // half second redrawn in place on a terminal, or a new line every 10 seconds otherwise.
  ProgressLine(uint64_t bytes_total, std::FILE* out, double quiet_seconds = 2.0);
  ~ProgressLine();  // stops the thread; ends a redrawn line with a newline
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // Called by the workers as pieces finish.
  void add(uint64_t bytes, uint64_t tokens) {
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
    tokens_.fetch_add(tokens, std::memory_order_relaxed);
  }

 private:
  void run();

  const uint64_t total_;
  std::FILE* out_;
  const double quiet_seconds_;
  const bool terminal_;
  const std::chrono::steady_clock::time_point start_;
  std::atomic<uint64_t> bytes_{0}, tokens_{0};
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool printed_ = false;
  std::thread thread_;
};

}  // namespace fsdp::tokenize
