// ParallelSlice: which part of a full parameter one tensor-parallel rank holds, as plain
// values (no memory, no communication), so that initialization, checkpoints and exports can
// address every local element by its coordinates in the full tensor.
//
// The local tensor is the concatenation, along `dim`, of the ranges [begin, end) of the full
// tensor's `dim`, in order; every other dimension is whole. A column-parallel weight (out, in)
// holds rows (dim 0) of the full weight, a row-parallel one columns (dim 1); a fused
// projection holds several ranges, one per part (qkv: its query, key and value heads).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/shape.h"

namespace fsdp::nn {

struct ParallelSlice {
  Shape full_shape;
  int dim = 0;
  std::vector<std::pair<int64_t, int64_t>> ranges;  // [begin, end) of full_shape[dim]
  // Per range, how many tensor-parallel ranks hold it (empty: one each). Grouped-query
  // attention with fewer key/value heads than ranks gives a head's rows to `replicas`
  // consecutive ranks (an aligned block: the ranks r with equal r / replicas). The block's
  // first rank owns the range (it is saved and counted in norms from there), and the
  // block's gradients for it are summed.
  std::vector<int> replicas;
  int replicas_of(size_t range) const { return replicas.empty() ? 1 : replicas[range]; }

  // Throws ShapeError unless the ranges are non-empty, ordered, disjoint and inside dim,
  // and replicas (if any) gives each range a count >= 1.
  void check() const;
  Shape local_shape() const;
  int64_t local_numel() const { return local_shape().numel(); }

  // A run of consecutive local elements that are also consecutive in the full tensor.
  struct Run {
    int64_t local = 0;  // first local element (row-major flattening of the local shape)
    int64_t full = 0;   // the same element in the full tensor's flattening
    int64_t numel = 0;
    int replicas = 1;  // of the range it lies in
  };
  // Local elements [offset, offset + n) as runs, in local order; a run never spans two
  // ranges.
  std::vector<Run> runs(int64_t offset, int64_t n) const;
  // The runs that tensor-parallel rank `tp_rank` owns: all but those of ranges it holds as
  // a replica after the first.
  std::vector<Run> owned_runs(int64_t offset, int64_t n, int tp_rank) const;

  // The local element holding full element `full`, when the n full elements from there lie
  // in one run (consecutive locally too); -1 otherwise.
  int64_t local_of(int64_t full, int64_t n) const;

  std::string str() const;  // "dim 0 of (96, 32): [0, 16) [32, 40) [64, 72)"
  bool operator==(const ParallelSlice& o) const {
    return full_shape == o.full_shape && dim == o.dim && ranges == o.ranges &&
           replicas == o.replicas;
  }
};

// The equal part `rank` of `parts` of the range [begin, end): [begin + rank * len, ... + len)
// with len = (end - begin) / parts. Throws ShapeError naming `what` unless parts divides it.
std::pair<int64_t, int64_t> equal_part(int64_t begin, int64_t end, int rank, int parts,
                                       const std::string& what);

}  // namespace fsdp::nn
