#include "tools/tokenize/progress.h"

#include <unistd.h>

#include <cinttypes>

namespace fsdp::tokenize {

std::string progress_text(uint64_t bytes_done, uint64_t bytes_total, uint64_t tokens,
                          double seconds) {
  const double mb = 1e6;
  const double fraction = bytes_total > 0 ? double(bytes_done) / double(bytes_total) : 1.0;
  const double tokens_per_s = seconds > 0 ? double(tokens) / seconds : 0.0;
  char eta[32] = "?";
  if (bytes_done > 0 && seconds > 0) {
    const auto left = static_cast<uint64_t>(seconds * (1.0 - fraction) / fraction + 0.5);
    std::snprintf(eta, sizeof(eta), "%" PRIu64 ":%02" PRIu64 ":%02" PRIu64, left / 3600,
                  left / 60 % 60, left % 60);
  }
  char line[160];
  std::snprintf(line, sizeof(line), "%.1f / %.1f MB (%.1f%%) | %.2f M tokens/s | ETA %s",
                double(bytes_done) / mb, double(bytes_total) / mb, 100.0 * fraction,
                tokens_per_s / 1e6, eta);
  return line;
}

ProgressLine::ProgressLine(uint64_t bytes_total, std::FILE* out, double quiet_seconds)
    : total_(bytes_total),
      out_(out),
      quiet_seconds_(quiet_seconds),
      terminal_(isatty(fileno(out)) == 1),
      start_(std::chrono::steady_clock::now()),
      thread_([this] { run(); }) {}

ProgressLine::~ProgressLine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  if (printed_ && terminal_) std::fputc('\n', out_);
}

void ProgressLine::run() {
  const auto period = terminal_ ? std::chrono::milliseconds(500) : std::chrono::seconds(10);
  std::unique_lock<std::mutex> lock(mu_);
  // The first line comes after the quiet time, the next ones every period.
  auto next = start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(quiet_seconds_));
  while (!wake_.wait_until(lock, next, [this] { return stop_; })) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const std::string text = progress_text(bytes_.load(), total_, tokens_.load(), seconds);
    // Progress is a courtesy: a failed write to the terminal is not an error of the job.
    std::fprintf(out_, terminal_ ? "\rtokenize: %s   " : "tokenize: %s\n", text.c_str());
    std::fflush(out_);
    printed_ = true;
    next += period;
  }
}

}  // namespace fsdp::tokenize
