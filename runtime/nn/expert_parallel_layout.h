// ExpertParallelLayout: which experts a rank of the expert-parallel group holds, and the
// index math of exchanging the tokens' rows with the ranks that hold their experts, as plain
// values (no memory, no communication).
//
// E experts are split over ep ranks in equal contiguous parts: rank r holds experts
// [r E/ep, (r + 1) E/ep). A rank's rows, grouped by expert in global expert order
// (ops::moe_sort_by_expert), are then grouped by the rank that holds their expert too, so
// the part for rank p is one contiguous range (send_counts). The rows a rank receives lie
// source-major (every source's rows for local expert 0, 1, ...); the grouped matmul wants
// them expert-major (for each local expert, source 0's rows, then source 1's, ...), which is
// also the order a single process would give them when the sources' tokens come in rank
// order. regroup() gives the gather map between the two orders.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fsdp::nn {

struct ExpertParallelLayout {
  int64_t experts = 0;  // E, over the whole group
  int ep = 1;           // ranks
  int rank = 0;         // this rank

  // Throws ShapeError unless ep >= 1, 0 <= rank < ep and E is a positive multiple of ep.
  static ExpertParallelLayout make(int64_t experts, int ep, int rank);
  int64_t local_experts() const { return experts / ep; }
  int64_t first_expert(int r) const { return r * local_experts(); }
  int owner(int64_t expert) const { return int(expert / local_experts()); }

  // Rows this rank sends to each rank: `counts` (E) are its rows per expert, in global
  // expert order; rank p gets those of its experts.
  std::vector<size_t> send_counts(const std::vector<int64_t>& counts) const;
  // What this rank sends the others before the rows so they can place them: for each rank
  // p, this rank's counts of p's local experts (ep x E/ep, rank-major): `counts` reordered,
  // which is `counts` itself (the experts are contiguous per rank).
  // The receiving side: `received` (ep x E/ep) is, for each source s, s's counts of this
  // rank's local experts.
  struct Regroup {
    std::vector<size_t> recv_counts;     // (ep) rows from each source
    std::vector<int64_t> expert_counts;  // (E/ep) rows of each local expert, all sources
    // (rows) expert-major row i is source-major row gather[i]; and the inverse map:
    // source-major row j is expert-major row scatter[j].
    std::vector<int32_t> gather, scatter;
  };
  Regroup regroup(const std::vector<int64_t>& received) const;
};

}  // namespace fsdp::nn
