// The collectives a sharded model issues, each one counted and, with
// FsdpOptions::time_collectives, timed by CUDA events on its stream (from the moment the
// stream reaches it until it ends, waiting for the peers included).
#pragma once

#include <vector>

#include "collectives/communicator.h"
#include "runtime/core/context.h"
#include "runtime/fsdp/options.h"

namespace fsdp {

class CollectiveCalls {
 public:
  // skip: FsdpOptions::skip_collectives (nothing is exchanged; see communicates()).
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
