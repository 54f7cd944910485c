// Where Muon's matrices lie in a sharded model's flat buffers and which rank orthogonalizes
// each: plain values, computed identically on every rank from the units' geometry (which
// runtime/parallel/muon_matrices.h reads from the sharding plan).
//
// Muon updates a matrix with its whole momentum orthogonalized, but a ZeRO shard is a flat
// slice that cuts matrices anywhere. So each unit's step gathers the unit's momentum update
// over its shard group (every rank then holds every matrix of the unit whole), each matrix's
// owner orthogonalizes it, and a reduce-scatter brings every rank its shard of the result
// (the owners' values summed with zeros: exact). Owners are chosen per unit so that the
// ranks' Newton-Schulz work (FLOPs) is balanced, and run at the same time.
//
// A parameter Muon takes may hold several matrices: the fused [q | k | v] projection and
// SwiGLU's [gate | up] are orthogonalized part by part (row_parts), and an experts' weight
// (experts, rows, cols) matrix by matrix (batched). A parameter that tensor parallelism
// slices is first made whole over its group (WholeMatrix), then split into its matrices.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collectives/collective_calls.h"
#include "runtime/core/context.h"
#include "runtime/core/shape.h"
#include "runtime/core/tensor.h"

namespace fsdp {

// How a parameter's local slice becomes the whole parameter and back: implemented by the
// parallelism that slices it (runtime/parallel). Both calls are collective over its group.
class WholeMatrix {
 public:
  virtual ~WholeMatrix() = default;
  virtual Shape whole_shape() const = 0;
  // whole = the whole parameter, from every rank's `local` slice (its collectives issued
  // through `calls`, the step's counted path).
  virtual void assemble(Context& ctx, CollectiveCalls& calls, const Tensor& local,
                        const Tensor& whole) = 0;
  // local = this rank's slice of `whole`.
  virtual void slice(Context& ctx, const Tensor& whole, const Tensor& local) = 0;
};

// A parameter Muon updates, as the model's plans describe it.
struct MuonParamSpec {
  std::string name;
  // Rows of the whole parameter that are separate matrices, in order ([q, k, v] rows);
  // empty: one matrix.
  std::vector<int64_t> row_parts;
  bool batched = false;           // dim 0 indexes separate matrices (experts)
  WholeMatrix* whole = nullptr;   // null: the parameter is whole on this rank
};

// How Muon's update is scaled by the matrix's shape (PyTorch's adjust_lr_fn).
enum class MuonScale : uint8_t {
  match_rms_adamw,  // 0.2 * sqrt(max(rows, cols)): the update's RMS matches AdamW's
  original,         // sqrt(max(1, rows / cols))
};
double muon_scale(MuonScale scale, int64_t rows, int64_t cols);

// A unit of a sharded model as Muon needs it: its flat buffer's size, this rank's shard of
// it, and where its parameters lie (as runtime/fsdp/plan.h's UnitPlan says).
struct MuonUnitGeometry {
  struct Param {
    std::string name;
    Shape shape;         // as this rank holds it
    int64_t offset = 0;  // first element in the unit's flat buffer
  };
  std::string name;
  std::vector<Param> params;
  int64_t padded_numel = 0;
  int64_t shard_numel = 0;  // padded_numel / shard ranks
  int shard_rank = 0, shard_size = 1;
  int64_t shard_begin() const { return int64_t(shard_rank) * shard_numel; }
};

// One matrix of a parameter, in the whole parameter's coordinates.
struct MuonMatrix {
  int64_t first = 0;  // first element in the whole parameter
  int64_t rows = 0, cols = 0;
};

// One parameter of a unit that Muon updates.
struct MuonItem {
  int64_t offset = 0;  // first element in the unit's flat buffer
  Shape local_shape;   // as this rank holds it
  std::vector<MuonMatrix> matrices;
  WholeMatrix* whole = nullptr;
  int owner = 0;       // shard rank that orthogonalizes it
  double flops = 0;    // Newton-Schulz work of its matrices
};

struct MuonUnit {
  int unit = 0;  // index among the geometries (the plan's units)
  MuonUnitGeometry geometry;
  std::vector<MuonItem> items;
};

// Newton-Schulz FLOPs of one (rows, cols) matrix over `steps` iterations.
double newton_schulz_flops(int64_t rows, int64_t cols, int steps);

// The Muon items of every unit (units without any are left out), owners balanced over each
// unit's shard ranks by longest-first assignment (ties to the rank with the least work over
// all units so far). Throws ConfigError for a spec that names no parameter of the units or
// whose parts do not fit its shape.
std::vector<MuonUnit> muon_units(const std::vector<MuonUnitGeometry>& units,
                                 const std::vector<MuonParamSpec>& specs, int ns_steps);

// The pieces of this rank's shard of `muon`'s unit (shard offsets) that belong to its items.
struct ShardPiece {
  int64_t shard_offset = 0;
  int64_t numel = 0;
};
std::vector<ShardPiece> muon_shard_pieces(const MuonUnit& muon);

}  // namespace fsdp
