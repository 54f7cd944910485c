// ContextParallelLayout: which tokens of each sequence a context-parallel rank holds, as
// plain values (no memory, no communication).
//
// A sequence of T tokens is cut into 2·cp chunks of c = T / (2·cp) tokens; rank r holds
// chunks r and 2·cp − 1 − r, in that order, as its local rows [0, c) and [c, 2c). Under the
// causal mask an early chunk's queries see few keys and a late one's many, so every rank
// gets the same attention work (causal load balancing).
#pragma once

#include <cstdint>

namespace fsdp::nn {

struct ContextParallelLayout {
  int64_t seq = 0;  // T: the whole sequence
  int cp = 1;       // ranks
  int rank = 0;     // this rank

  // Throws ShapeError unless cp >= 1, 0 <= rank < cp and T is a multiple of 2·cp.
  static ContextParallelLayout make(int64_t seq, int cp, int rank);
  int64_t chunk() const { return seq / (2 * cp); }  // c
  int64_t local_seq() const { return 2 * chunk(); }  // T / cp
  // The chunk of the sequence that local chunk i (0 or 1) of rank r is.
  int64_t chunk_of(int r, int i) const { return i == 0 ? r : 2 * cp - 1 - r; }
  // The position in the sequence of this rank's local chunk i's first token.
  int64_t chunk_begin(int i) const { return chunk_of(rank, i) * chunk(); }
  // The position in the sequence of local row `local` of rank r.
  int64_t position(int r, int64_t local) const {
    return chunk_of(r, int(local / chunk())) * chunk() + local % chunk();
  }
};

}  // namespace fsdp::nn
