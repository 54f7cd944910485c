#include "collectives/collective_calls.h"

namespace fsdp {

template <typename Call>
void CollectiveCalls::issue(CollectiveKind kind, int64_t bytes, const Stream& stream, Call&& call) {
  Event start;
  if (time_) {
    start = Event::create(ctx_.device(), /*enable_timing=*/true);
    start.record(stream);
  }
  call();
  switch (kind) {
    case CollectiveKind::all_gather:
      issued_.all_gathers++;
      issued_.all_gather_bytes += bytes;
      break;
    case CollectiveKind::reduce_scatter:
      issued_.reduce_scatters++;
      issued_.reduce_scatter_bytes += bytes;
      break;
    default:
      issued_.all_reduces++;
      issued_.all_reduce_bytes += bytes;
      break;
  }
  if (!time_) return;
  Event end = Event::create(ctx_.device(), /*enable_timing=*/true);
  end.record(stream);
  spans_.push_back(Span{kind, bytes, start, end});
}

void CollectiveCalls::all_gather(Communicator& c, const Tensor& out, const Tensor& in,
                                 const Stream& stream) {
  issue(CollectiveKind::all_gather, out.nbytes(), stream, [&] { c.all_gather(out, in, stream); });
}

void CollectiveCalls::reduce_scatter(Communicator& c, const Tensor& out, const Tensor& in,
                                     ReduceOp op, const Stream& stream, double prescale) {
  issue(CollectiveKind::reduce_scatter, in.nbytes(), stream,
        [&] { c.reduce_scatter(out, in, op, stream, prescale); });
}

void CollectiveCalls::all_reduce(Communicator& c, const Tensor& t, ReduceOp op,
                                 const Stream& stream, double prescale) {
  issue(CollectiveKind::all_reduce, t.nbytes(), stream,
        [&] { c.all_reduce(t, op, stream, prescale); });
}

CollectiveTimes CollectiveCalls::take_times() {
  CollectiveTimes t;
  for (const Span& s : spans_) {
    CollectiveTime& c = s.kind == CollectiveKind::all_gather       ? t.all_gather
                        : s.kind == CollectiveKind::reduce_scatter ? t.reduce_scatter
                                                                   : t.all_reduce;
    s.end.synchronize();
    c.count++;
    c.bytes += s.bytes;
    c.ms += Event::elapsed_ms(s.start, s.end);
  }
  spans_.clear();
  return t;
}

}  // namespace fsdp
