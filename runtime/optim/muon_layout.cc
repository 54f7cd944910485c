#include "runtime/optim/muon_layout.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/core/error.h"

namespace fsdp {

double muon_scale(MuonScale scale, int64_t rows, int64_t cols) {
  if (scale == MuonScale::match_rms_adamw) return 0.2 * std::sqrt(double(std::max(rows, cols)));
  return std::sqrt(std::max(1.0, double(rows) / double(cols)));
}

double newton_schulz_flops(int64_t rows, int64_t cols, int steps) {
  const double m = double(std::min(rows, cols)), n = double(std::max(rows, cols));
  return double(steps) * (4 * m * m * n + 2 * m * m * m);  // X X^T, A A, B X
}

namespace {

// The matrices of a whole parameter of `shape` as `spec` splits it.
std::vector<MuonMatrix> matrices_of(const MuonParamSpec& spec, const Shape& shape) {
  FSDP_CHECK(shape.rank() == (spec.batched ? 3 : 2), ConfigError, "muon: parameter ", spec.name,
             " has shape ", shape.str(), "; ", spec.batched ? "(experts, rows, cols)" : "(rows, cols)",
             " expected");
  const int64_t batch = spec.batched ? shape[0] : 1;
  const int64_t rows = shape.at(-2), cols = shape.at(-1);
  std::vector<int64_t> parts = spec.row_parts.empty() ? std::vector<int64_t>{rows} : spec.row_parts;
  const int64_t total = std::accumulate(parts.begin(), parts.end(), int64_t(0));
  FSDP_CHECK(total == rows && std::all_of(parts.begin(), parts.end(), [](int64_t p) { return p > 0; }),
             ConfigError, "muon: parameter ", spec.name, " has ", rows,
             " rows, which its matrices' rows do not split (they sum to ", total, ")");
  std::vector<MuonMatrix> out;
  for (int64_t b = 0; b < batch; ++b) {
    int64_t row = 0;
    for (int64_t p : parts) {
      out.push_back({(b * rows + row) * cols, p, cols});
      row += p;
    }
  }
  return out;
}

}  // namespace

std::vector<MuonUnit> muon_units(const std::vector<MuonUnitGeometry>& units,
                                 const std::vector<MuonParamSpec>& specs, int ns_steps) {
  std::vector<int> found(specs.size(), 0);
  std::vector<MuonUnit> out;
  std::vector<double> total_work;  // per shard rank, over all units so far
  for (size_t u = 0; u < units.size(); ++u) {
    MuonUnit mu;
    mu.unit = int(u);
    mu.geometry = units[u];
    for (const MuonUnitGeometry::Param& p : units[u].params) {
      for (size_t s = 0; s < specs.size(); ++s) {
        if (specs[s].name != p.name) continue;
        ++found[s];
        MuonItem item;
        item.offset = p.offset;
        item.local_shape = p.shape;
        item.whole = specs[s].whole;
        item.matrices = matrices_of(specs[s], item.whole ? item.whole->whole_shape() : p.shape);
        for (const MuonMatrix& m : item.matrices) item.flops += newton_schulz_flops(m.rows, m.cols, ns_steps);
        mu.items.push_back(std::move(item));
      }
    }
    if (mu.items.empty()) continue;
    // Longest first, each to the rank with the least work in this unit (then overall).
    const int ranks = std::max(1, units[u].shard_size);
    if (int(total_work.size()) < ranks) total_work.resize(size_t(ranks), 0.0);
    std::vector<size_t> order(mu.items.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return mu.items[a].flops > mu.items[b].flops; });
    std::vector<double> work(size_t(ranks), 0.0);
    for (size_t i : order) {
      int best = 0;
      for (int r = 1; r < ranks; ++r) {
        if (work[size_t(r)] < work[size_t(best)] ||
            (work[size_t(r)] == work[size_t(best)] && total_work[size_t(r)] < total_work[size_t(best)]))
          best = r;
      }
      mu.items[i].owner = best;
      work[size_t(best)] += mu.items[i].flops;
      total_work[size_t(best)] += mu.items[i].flops;
    }
    out.push_back(std::move(mu));
  }
  for (size_t s = 0; s < specs.size(); ++s)
    FSDP_CHECK(found[s] == 1, ConfigError, "muon: parameter ", specs[s].name, " is ",
               found[s] == 0 ? "not in the sharded model" : "in it more than once");
  return out;
}

std::vector<ShardPiece> muon_shard_pieces(const MuonUnit& muon) {
  const int64_t lo = muon.geometry.shard_begin(), hi = lo + muon.geometry.shard_numel;
  std::vector<ShardPiece> out;
  for (const MuonItem& item : muon.items) {
    const int64_t b = std::max(lo, item.offset), e = std::min(hi, item.offset + item.local_shape.numel());
    if (b < e) out.push_back({b - lo, e - b});
  }
  std::sort(out.begin(), out.end(),
            [](const ShardPiece& a, const ShardPiece& b) { return a.shard_offset < b.shard_offset; });
  return out;
}

}  // namespace fsdp
