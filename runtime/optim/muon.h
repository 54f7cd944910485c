// Muon's orthogonalization over a sharded model's units (the layout: muon_layout.h).
//
// For one unit, given this rank's shard of the momentum update (only the Muon items' pieces
// are read), orthogonalize() leaves in `out_shard` this rank's shard of the update to apply:
// each matrix orthogonalized by Newton-Schulz (kernels/newton_schulz.h) and multiplied by its
// shape's scale (MuonScale). Over a shard group of several ranks: the update is all-gathered,
// each item's owner orthogonalizes its matrices (a parameter sliced by tensor parallelism
// made whole first, over its own group), and a reduce-scatter sums the owners' results into
// every rank's shard. Exact: every matrix is computed whole, once, by the same operations as
// on one rank, and the sum adds it to zeros.
#pragma once

#include <memory>
#include <vector>

#include "collectives/collective_calls.h"
#include "collectives/communicator.h"
#include "kernels/ops.h"
#include "runtime/core/context.h"
#include "runtime/core/tensor.h"
#include "runtime/optim/muon_layout.h"

namespace fsdp {

struct MuonOptions {
  double momentum = 0.95;
  bool nesterov = true;
  ops::NewtonSchulzScalars newton_schulz;
  MuonScale scale = MuonScale::match_rms_adamw;
};

// A unit's shard group (its all-gather and reduce-scatter communicators); null for one rank.
struct MuonGroup {
  Communicator* gather = nullptr;
  Communicator* reduce = nullptr;
};

class MuonOrthogonalizer {
 public:
  // groups[i] is units[i]'s; exchanges in `dtype` (the momentum's, f32 or f64) through
  // `calls` (the sharded model's: counted and timed with the step's other collectives; with
  // skip_collectives nothing is exchanged and the owners' work still runs).
  MuonOrthogonalizer(Context& ctx, CollectiveCalls& calls, std::vector<MuonUnit> units,
                     std::vector<MuonGroup> groups, DType dtype, const MuonOptions& options);

  const std::vector<MuonUnit>& units() const { return units_; }
  // Device bytes of the exchange buffers (the largest unit's gathered update and result).
  size_t buffer_bytes() const { return buffer_bytes_; }

  // update_shard, out_shard: (shard_numel) of units()[i], of the exchange dtype.
  void orthogonalize(size_t i, const Tensor& update_shard, const Tensor& out_shard);

 private:
  // Orthogonalizes item's matrices from `update` (its elements in the unit's full buffer)
  // into `out`, scaled.
  void orthogonalize_item(const MuonItem& item, const Tensor& update, const Tensor& out);

  Context& ctx_;
  CollectiveCalls& calls_;
  std::vector<MuonUnit> units_;
  std::vector<MuonGroup> groups_;
  DType dtype_;
  MuonOptions options_;
  Tensor full_update_, full_out_;  // the largest sharded unit's padded buffer, each
  size_t buffer_bytes_ = 0;
};

}  // namespace fsdp
