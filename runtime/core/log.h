// Logger: rank-aware, leveled lines on a stream. Owned by whoever runs the job (the
// trainer, a tool, a test); nothing here is global.
#pragma once

#include <cstdio>
#include <string>

#include "runtime/core/error.h"

namespace fsdp {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3, Off = 4 };

class Logger {
 public:
  // Lines go to `out` (stdout by default). Only `rank` 0 prints Info and Debug lines unless
  // all_ranks is set; warnings and errors print on every rank, prefixed with the rank.
  explicit Logger(int rank = 0, LogLevel level = LogLevel::Info, std::FILE* out = stdout,
                  bool all_ranks = false)
      : rank_(rank), level_(level), out_(out), all_ranks_(all_ranks) {}

  template <typename... Args> void debug(Args&&... a) { write(LogLevel::Debug, str_cat(a...)); }
  template <typename... Args> void info(Args&&... a) { write(LogLevel::Info, str_cat(a...)); }
  template <typename... Args> void warn(Args&&... a) { write(LogLevel::Warn, str_cat(a...)); }
  template <typename... Args> void error(Args&&... a) { write(LogLevel::Error, str_cat(a...)); }

  void set_level(LogLevel l) { level_ = l; }
  LogLevel level() const { return level_; }
  int rank() const { return rank_; }

  void write(LogLevel level, const std::string& line);

 private:
  int rank_;
  LogLevel level_;
  std::FILE* out_;
  bool all_ranks_;
};

}  // namespace fsdp
