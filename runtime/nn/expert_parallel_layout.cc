#include "runtime/nn/expert_parallel_layout.h"

#include <limits>

#include "runtime/core/error.h"

namespace fsdp::nn {

ExpertParallelLayout ExpertParallelLayout::make(int64_t experts, int ep, int rank) {
  FSDP_CHECK(ep >= 1 && rank >= 0 && rank < ep, ShapeError, "expert parallelism: rank ", rank,
             " of ", ep);
  FSDP_CHECK(experts > 0 && experts % ep == 0, ShapeError, "expert parallelism: ", experts,
             " experts do not split into ", ep, " equal parts");
  return {experts, ep, rank};
}

std::vector<size_t> ExpertParallelLayout::send_counts(const std::vector<int64_t>& counts) const {
  FSDP_CHECK(int64_t(counts.size()) == experts, ShapeError, "expert parallelism: ",
             counts.size(), " counts for ", experts, " experts");
  std::vector<size_t> out(size_t(ep), 0);
  for (int64_t e = 0; e < experts; ++e) {
    FSDP_CHECK(counts[size_t(e)] >= 0, ValueError, "expert parallelism: expert ", e,
               " has a negative count ", counts[size_t(e)]);
    out[size_t(owner(e))] += size_t(counts[size_t(e)]);
  }
  return out;
}

ExpertParallelLayout::Regroup ExpertParallelLayout::regroup(
    const std::vector<int64_t>& received) const {
  const int64_t local = local_experts();
  FSDP_CHECK(int64_t(received.size()) == ep * local, ShapeError, "expert parallelism: ",
             received.size(), " received counts for ", ep, " ranks x ", local, " local experts");
  Regroup g;
  g.recv_counts.assign(size_t(ep), 0);
  g.expert_counts.assign(size_t(local), 0);
  // Where each (source, expert) block starts in the source-major order.
  std::vector<int64_t> block_start(received.size());
  int64_t at = 0;
  for (int s = 0; s < ep; ++s)
    for (int64_t e = 0; e < local; ++e) {
      const int64_t n = received[size_t(s * local + e)];
      FSDP_CHECK(n >= 0, ValueError, "expert parallelism: rank ", s, " sends ", n,
                 " rows to local expert ", e);
      block_start[size_t(s * local + e)] = at;
      at += n;
      g.recv_counts[size_t(s)] += size_t(n);
      g.expert_counts[size_t(e)] += n;
    }
  FSDP_CHECK(at <= std::numeric_limits<int32_t>::max(), ShapeError, "expert parallelism: ", at,
             " received rows exceed the row maps' int32 range");
  g.gather.reserve(size_t(at));
  g.scatter.assign(size_t(at), 0);
  for (int64_t e = 0; e < local; ++e)
    for (int s = 0; s < ep; ++s) {
      const int64_t start = block_start[size_t(s * local + e)];
      for (int64_t i = 0; i < received[size_t(s * local + e)]; ++i) {
        g.scatter[size_t(start + i)] = int32_t(g.gather.size());
        g.gather.push_back(int32_t(start + i));
      }
    }
  return g;
}

}  // namespace fsdp::nn
