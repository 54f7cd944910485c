#include "runtime/nn/parallel_slice.h"

#include <algorithm>

#include "runtime/core/error.h"

namespace fsdp::nn {

void ParallelSlice::check() const {
  FSDP_CHECK(dim >= 0 && dim < int(full_shape.rank()), ShapeError, "parallel slice: dim ", dim,
             " is not a dimension of ", full_shape);
  FSDP_CHECK(!ranges.empty(), ShapeError, "parallel slice of ", full_shape, ": no ranges");
  int64_t previous_end = 0;
  for (const auto& [b, e] : ranges) {
    FSDP_CHECK(b >= previous_end && b < e && e <= full_shape[dim], ShapeError,
               "parallel slice ", str(), ": the ranges must be non-empty, ordered, disjoint and "
               "inside the dimension");
    previous_end = e;
  }
  FSDP_CHECK(replicas.empty() || replicas.size() == ranges.size(), ShapeError, "parallel slice ",
             str(), ": ", replicas.size(), " replica counts for ", ranges.size(), " ranges");
  for (int r : replicas)
    FSDP_CHECK(r >= 1, ShapeError, "parallel slice ", str(), ": a range held by ", r, " ranks");
}

Shape ParallelSlice::local_shape() const {
  std::vector<int64_t> dims = full_shape.dims();
  int64_t n = 0;
  for (const auto& [b, e] : ranges) n += e - b;
  dims[size_t(dim)] = n;
  return Shape(dims);
}

std::vector<ParallelSlice::Run> ParallelSlice::runs(int64_t offset, int64_t n) const {
  const std::vector<int64_t>& full = full_shape.dims();
  int64_t inner = 1;  // elements of one index of `dim`
  for (size_t d = size_t(dim) + 1; d < full.size(); ++d) inner *= full[d];
  const int64_t full_row = full[size_t(dim)] * inner;  // one index of the outer dimensions
  const int64_t local_row = local_shape()[dim] * inner;
  std::vector<Run> out;
  const int64_t end = offset + n;
  // Each (outer index, range) is one contiguous block in both flattenings.
  for (int64_t o = offset / std::max<int64_t>(local_row, 1); o * local_row < end; ++o) {
    int64_t local = o * local_row;
    for (size_t i = 0; i < ranges.size(); ++i) {
      const auto [b, e] = ranges[i];
      const int64_t len = (e - b) * inner;
      const int64_t lo = std::max(local, offset), hi = std::min(local + len, end);
      if (lo < hi) out.push_back({lo, o * full_row + b * inner + (lo - local), hi - lo, replicas_of(i)});
      local += len;
    }
  }
  return out;
}

std::vector<ParallelSlice::Run> ParallelSlice::owned_runs(int64_t offset, int64_t n,
                                                          int tp_rank) const {
  std::vector<Run> out;
  for (const Run& r : runs(offset, n))
    if (tp_rank % r.replicas == 0) out.push_back(r);
  return out;
}

int64_t ParallelSlice::local_of(int64_t full, int64_t n) const {
  const std::vector<int64_t>& dims = full_shape.dims();
  int64_t inner = 1;
  for (size_t d = size_t(dim) + 1; d < dims.size(); ++d) inner *= dims[d];
  const int64_t full_row = dims[size_t(dim)] * inner;
  const int64_t local_row = local_shape()[dim] * inner;
  if (full < 0 || n <= 0 || full + n > full_shape.numel()) return -1;
  const int64_t o = full / full_row, within = full % full_row;  // outer index, offset in it
  int64_t local = o * local_row;
  for (const auto& [b, e] : ranges) {
    const int64_t lo = b * inner, hi = e * inner;
    if (within >= lo && within + n <= hi) return local + (within - lo);
    local += hi - lo;
  }
  return -1;
}

std::string ParallelSlice::str() const {
  std::string s = str_cat("dim ", dim, " of ", full_shape, ":");
  for (size_t i = 0; i < ranges.size(); ++i) {
    s += str_cat(" [", ranges[i].first, ", ", ranges[i].second, ")");
    if (replicas_of(i) > 1) s += str_cat(" on ", replicas_of(i), " ranks");
  }
  return s;
}

std::pair<int64_t, int64_t> equal_part(int64_t begin, int64_t end, int rank, int parts,
                                       const std::string& what) {
  const int64_t n = end - begin;
  FSDP_CHECK(parts > 0 && rank >= 0 && rank < parts && n % parts == 0, ShapeError, what, ": ", n,
             " cannot be split into ", parts, " equal parts");
  const int64_t len = n / parts;
  return {begin + rank * len, begin + (rank + 1) * len};
}

}  // namespace fsdp::nn
