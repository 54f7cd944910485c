#include "collectives/health.h"

#include "runtime/core/error.h"

namespace fsdp {

bool CommHealth::record_failure(FailureKind kind, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (kind_ != FailureKind::None) return false;
    kind_ = kind;
    message_ = message;
    failed_.store(true, std::memory_order_release);
  }
  if (on_failure_) on_failure_(message);
  return true;
}

FailureKind CommHealth::failure_kind() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kind_;
}

std::string CommHealth::failure_message() const {
  std::lock_guard<std::mutex> lock(mu_);
  return message_;
}

void CommHealth::raise() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (kind_ == FailureKind::Timeout) throw TimeoutError(message_);
  throw CommError(message_);
}

}  // namespace fsdp
