// A transfer started by a parallel group's start_* call (tensor, context or expert
// parallelism) and finished later, so that the caller computes in between.
#pragma once

#include "runtime/core/context.h"

namespace fsdp::nn {

// finish() makes ctx's stream wait for the transfer: what it received is then ready and
// what it sent may be written again.
class PendingTransfer {
 public:
  virtual ~PendingTransfer() = default;
  virtual void finish(Context& ctx) = 0;
};

// A transfer that completed when it was started (the CPU, and groups that do not overlap).
struct CompletedTransfer : PendingTransfer {
  void finish(Context&) override {}
};

}  // namespace fsdp::nn
