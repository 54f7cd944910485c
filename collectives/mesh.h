// Device mesh: the world's ranks arranged on named axes, and the communicators per axis.
//
// Axes, slowest-varying first: dp_outer (replicas of HSDP), dp_shard (FSDP sharding),
// cp (context parallel), ep (expert parallel), tp (tensor parallel, fastest-varying, so a
// tensor-parallel group is consecutive ranks, i.e. one node's GPUs). The ranks that take
// different data are dp_outer x dp_shard x ep: expert parallelism splits the experts over
// ep ranks that each run their own tokens (and exchange them), so the dense parameters are
// data-parallel over all three and the experts over dp_outer x dp_shard.
//
// Mesh is a pure value type (rank <-> coordinates, groups), tested without any process.
// MeshCommunicators builds the communicators of one rank from a World: one per axis group,
// and for each data-parallel group (dp_shard, dp_outer, dp) two, one for all-gathers and
// one for reduce-scatters, since NCCL runs one communicator's operations in host launch
// order even across streams and the two kinds must overlap.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"

namespace fsdp {

class World;

enum class MeshAxis : int { dp_outer = 0, dp_shard = 1, cp = 2, ep = 3, tp = 4 };
constexpr int kNumMeshAxes = 5;
const char* mesh_axis_name(MeshAxis axis);  // "dp_outer", ...

using MeshSizes = std::array<int, kNumMeshAxes>;   // in axis order
using MeshCoords = std::array<int, kNumMeshAxes>;  // in axis order

class Mesh {
 public:
  // `sizes` in axis order; at most one may be -1, which takes whatever the others leave of
  // `world_size`. Throws ConfigError naming the axes for shapes that cannot be.
  Mesh(const MeshSizes& sizes, int world_size);

  int world_size() const { return world_size_; }
  int size(MeshAxis axis) const { return sizes_[size_t(axis)]; }
  const MeshSizes& sizes() const { return sizes_; }
  // The ranks that take different data (dp_outer x dp_shard x ep).
  int dp_size() const {
    return size(MeshAxis::dp_outer) * size(MeshAxis::dp_shard) * size(MeshAxis::ep);
  }

  MeshCoords coords(int rank) const;
  int rank_of(const MeshCoords& coords) const;

  // The ranks that agree with `rank` on every axis not in `axes`, in ascending order (which
  // is row-major order over `axes`); `rank`'s index in it is its rank in the group.
  std::vector<int> group(const std::vector<MeshAxis>& axes, int rank) const;
  std::vector<int> axis_group(MeshAxis axis, int rank) const { return group({axis}, rank); }
  std::vector<int> dp_group(int rank) const {
    return group({MeshAxis::dp_outer, MeshAxis::dp_shard, MeshAxis::ep}, rank);
  }

  std::string str() const;  // "dp_outer=1 x dp_shard=2 x cp=1 x ep=1 x tp=2"

 private:
  void check_rank(int rank) const;

  MeshSizes sizes_;
  int world_size_;
};

// The data-parallel groups that get an all-gather and a reduce-scatter communicator. The
// context-parallel ranks belong to dp_shard and dp (they hold the same parameters and
// reduce their gradients together; dp_group() of the data is without them), and so do the
// expert-parallel ones (for the dense parameters). The experts' groups leave ep out:
// expert_dp_shard = dp_shard x cp, expert_dp = dp_outer x dp_shard x cp; they exist only
// when ep > 1 (otherwise they are dp_shard and dp).
enum class DpGroup { dp_shard, dp_outer, dp, expert_dp_shard, expert_dp };
constexpr int kNumDpGroups = 5;
const char* dp_group_name(DpGroup group);  // "dp_shard", "dp_outer", "dp", ...

class MeshCommunicators {
 public:
  // Collective over the world: every rank builds the same communicators in the same order.
  // The mesh must cover the world; the communicators must be destroyed before the World.
  MeshCommunicators(World& world, const Mesh& mesh);
  ~MeshCommunicators();

  const Mesh& mesh() const { return mesh_; }
  // cp, ep, tp: the axis's communicator. dp_outer, dp_shard: their all-gather communicator
  // (dp_shard's spans the cp ranks too: DpGroup).
  Communicator& axis(MeshAxis axis);
  Communicator& all_gather_comm(DpGroup group);      // named e.g. "dp_shard/ag"
  Communicator& reduce_scatter_comm(DpGroup group);  // named e.g. "dp_shard/rs"

 private:
  Mesh mesh_;
  std::array<std::unique_ptr<Communicator>, 3> model_axes_;  // cp, ep, tp
  std::array<std::unique_ptr<Communicator>, kNumDpGroups> gather_;  // by DpGroup
  std::array<std::unique_ptr<Communicator>, kNumDpGroups> reduce_;  // by DpGroup
};

}  // namespace fsdp
