#include "runtime/core/log.h"

namespace fsdp {

void Logger::write(LogLevel level, const std::string& line) {
  if (level < level_ || !out_) return;
  const bool important = level >= LogLevel::Warn;
  if (!important && !all_ranks_ && rank_ != 0) return;
  const char* tag = level == LogLevel::Warn ? "warning: " : level == LogLevel::Error ? "error: " : "";
  if (important || all_ranks_)
    std::fprintf(out_, "[rank %d] %s%s\n", rank_, tag, line.c_str());
  else
    std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

}  // namespace fsdp
