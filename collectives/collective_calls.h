// The collectives a training step issues (the sharded model's and the optimizer's), each
// one counted and, when asked, timed by CUDA events on its stream (from the moment the
// stream reaches it until it ends, waiting for the peers included).
#pragma once

#include <vector>

#include "collectives/communicator.h"
#include "runtime/core/context.h"

namespace fsdp {

// What the collectives of one step took on the device (FsdpOptions::time_collectives).
struct CollectiveTime {
  int64_t count = 0;
  int64_t bytes = 0;  // per rank: the full (gathered or reduced) buffer's size
  double ms = 0;      // summed over the collectives of the kind
};
struct CollectiveTimes {
  CollectiveTime all_gather, reduce_scatter, all_reduce;
};

// Collectives issued since the last reset (for tests of the schedule).
struct IssuedCollectives {
  int64_t all_gathers = 0, reduce_scatters = 0, all_reduces = 0;
  // Bytes per rank of the full (gathered or reduced) buffers, summed by kind.
  int64_t all_gather_bytes = 0, reduce_scatter_bytes = 0, all_reduce_bytes = 0;
};

class CollectiveCalls {
 public:
  // time_them: FsdpOptions::time_collectives; skip: FsdpOptions::skip_collectives (nothing
  // is exchanged; see communicates()).
  CollectiveCalls(Context& ctx, bool time_them, bool skip = false)
      : ctx_(ctx), time_(time_them && ctx.is_cuda()), skip_(skip) {}

  // Whether collectives over `c` really run (a group of one, or skip_collectives: no).
  bool communicates(const Communicator* c) const { return c && c->size() > 1 && !skip_; }

  void all_gather(Communicator& c, const Tensor& out, const Tensor& in, const Stream& stream);
  void reduce_scatter(Communicator& c, const Tensor& out, const Tensor& in, ReduceOp op,
                      const Stream& stream, double prescale);
  void all_reduce(Communicator& c, const Tensor& t, ReduceOp op, const Stream& stream,
                  double prescale);

  // Counts since the last reset_counts().
  const IssuedCollectives& issued() const { return issued_; }
  void reset_counts() { issued_ = IssuedCollectives(); }
  // The timed collectives since the last call, summed by kind. Call once the device has
  // finished them (after the step's loss was read).
  CollectiveTimes take_times();

 private:
  // Issues `call` (a collective of `kind` over `bytes`, the full buffer) on `stream`.
  template <typename Call>
  void issue(CollectiveKind kind, int64_t bytes, const Stream& stream, Call&& call);

  struct Span {
    CollectiveKind kind;
    int64_t bytes;
    Event start, end;
  };
  Context& ctx_;
  bool time_;
  bool skip_;
  IssuedCollectives issued_;
  std::vector<Span> spans_;
};

}  // namespace fsdp
