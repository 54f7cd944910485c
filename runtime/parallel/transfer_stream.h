// Where a parallel group's overlapped transfers run on a GPU: a stream of the group's own,
// started after what the caller's stream has queued, and the pending transfer handed back
// (its finish() makes the caller's stream wait for the communicator's work).
#pragma once

#include <vector>

#include "collectives/communicator.h"
#include "runtime/core/context.h"
#include "runtime/nn/pending_transfer.h"

namespace fsdp {

class TransferStream {
 public:
  // The stream, created on ctx's device at the first call, waiting for what ctx's stream has
  // queued so far (the transfer reads what that work produces).
  const Stream& after(Context& ctx);

 private:
  Stream stream_;
};

struct CommunicatorTransfer : nn::PendingTransfer {
  std::vector<Work> work;
  void finish(Context& ctx) override {
    for (const Work& w : work) w.wait(ctx.stream());
  }
};

}  // namespace fsdp
