#include "collectives/mesh.h"

#include "collectives/world.h"
#include "runtime/core/error.h"

namespace fsdp {

const char* mesh_axis_name(MeshAxis axis) {
  switch (axis) {
    case MeshAxis::dp_outer: return "dp_outer";
    case MeshAxis::dp_shard: return "dp_shard";
    case MeshAxis::cp: return "cp";
    case MeshAxis::ep: return "ep";
    case MeshAxis::tp: return "tp";
  }
  return "?";
}

const char* dp_group_name(DpGroup group) {
  switch (group) {
    case DpGroup::dp_shard: return "dp_shard";
    case DpGroup::dp_outer: return "dp_outer";
    case DpGroup::dp: return "dp";
    case DpGroup::expert_dp_shard: return "expert_dp_shard";
    case DpGroup::expert_dp: return "expert_dp";
  }
  return "?";
}

namespace {

std::string sizes_str(const MeshSizes& sizes) {
  std::string out;
  for (int a = 0; a < kNumMeshAxes; ++a) {
    if (a) out += " x ";
    out += str_cat(mesh_axis_name(MeshAxis(a)), "=", sizes[size_t(a)]);
  }
  return out;
}

}  // namespace

Mesh::Mesh(const MeshSizes& sizes, int world_size) : sizes_(sizes), world_size_(world_size) {
  FSDP_CHECK(world_size >= 1, ConfigError, "mesh: world size ", world_size, " must be positive");
  int fill = -1;
  int64_t known = 1;
  for (int a = 0; a < kNumMeshAxes; ++a) {
    const int s = sizes[size_t(a)];
    if (s == -1) {
      FSDP_CHECK(fill < 0, ConfigError, "mesh ", sizes_str(sizes), ": only one axis may be -1, ",
                 "but ", mesh_axis_name(MeshAxis(fill)), " and ", mesh_axis_name(MeshAxis(a)),
                 " both are");
      fill = a;
      continue;
    }
    FSDP_CHECK(s >= 1, ConfigError, "mesh ", sizes_str(sizes), ": ", mesh_axis_name(MeshAxis(a)),
               "=", s, " must be positive (or -1 to fill the rest)");
    known *= s;
  }
  if (fill >= 0) {
    FSDP_CHECK(world_size % known == 0, ConfigError, "mesh ", sizes_str(sizes), ": ",
               mesh_axis_name(MeshAxis(fill)), "=-1 cannot fill a world of ", world_size,
               " ranks: the other axes take ", known, ", which does not divide it");
    sizes_[size_t(fill)] = int(world_size / known);
    known = world_size;
  }
  FSDP_CHECK(known == world_size, ConfigError, "mesh ", sizes_str(sizes), " has ", known,
             " ranks, but the world has ", world_size);
}

void Mesh::check_rank(int rank) const {
  FSDP_CHECK(rank >= 0 && rank < world_size_, IndexError, "mesh ", str(), ": rank ", rank,
             " is not in a world of ", world_size_);
}

MeshCoords Mesh::coords(int rank) const {
  check_rank(rank);
  MeshCoords c{};
  for (int a = kNumMeshAxes - 1; a >= 0; --a) {
    c[size_t(a)] = rank % sizes_[size_t(a)];
    rank /= sizes_[size_t(a)];
  }
  return c;
}

int Mesh::rank_of(const MeshCoords& coords) const {
  int rank = 0;
  for (int a = 0; a < kNumMeshAxes; ++a) {
    const int c = coords[size_t(a)];
    FSDP_CHECK(c >= 0 && c < sizes_[size_t(a)], IndexError, "mesh ", str(), ": coordinate ",
               mesh_axis_name(MeshAxis(a)), "=", c, " is outside 0..", sizes_[size_t(a)] - 1);
    rank = rank * sizes_[size_t(a)] + c;
  }
  return rank;
}

std::vector<int> Mesh::group(const std::vector<MeshAxis>& axes, int rank) const {
  const MeshCoords base = coords(rank);
  std::array<bool, kNumMeshAxes> varies{};
  for (MeshAxis a : axes) varies[size_t(a)] = true;
  std::vector<int> out;
  for (int r = 0; r < world_size_; ++r) {
    const MeshCoords c = coords(r);
    bool same = true;
    for (int a = 0; a < kNumMeshAxes; ++a) {
      if (!varies[size_t(a)] && c[size_t(a)] != base[size_t(a)]) same = false;
    }
    if (same) out.push_back(r);
  }
  return out;
}

std::string Mesh::str() const { return sizes_str(sizes_); }

// ---- communicators

namespace {

// Splits the world into the groups `axes` define; the color of a group is its lowest rank.
std::unique_ptr<Communicator> split_groups(World& world, const Mesh& mesh,
                                           const std::vector<MeshAxis>& axes,
                                           const std::string& name) {
  const std::vector<int> members = mesh.group(axes, world.rank());
  int key = 0;
  while (members[size_t(key)] != world.rank()) ++key;
  return world.split(name, members.front(), key);
}

std::vector<MeshAxis> dp_axes(DpGroup group) {
  switch (group) {
    // Context-parallel ranks hold the same parameters and reduce their gradients with the
    // data-parallel ones (FSDP shards over dp_shard x cp), as do expert-parallel ones for
    // the dense parameters.
    case DpGroup::dp_shard: return {MeshAxis::dp_shard, MeshAxis::cp, MeshAxis::ep};
    case DpGroup::dp_outer: return {MeshAxis::dp_outer};
    case DpGroup::dp: return {MeshAxis::dp_outer, MeshAxis::dp_shard, MeshAxis::cp, MeshAxis::ep};
    case DpGroup::expert_dp_shard: return {MeshAxis::dp_shard, MeshAxis::cp};
    case DpGroup::expert_dp: return {MeshAxis::dp_outer, MeshAxis::dp_shard, MeshAxis::cp};
  }
  return {};
}

}  // namespace

MeshCommunicators::MeshCommunicators(World& world, const Mesh& mesh) : mesh_(mesh) {
  FSDP_CHECK(mesh.world_size() == world.size(), ConfigError, "mesh ", mesh.str(), " covers ",
             mesh.world_size(), " ranks, but the world has ", world.size());
  // The same order on every rank: each split is collective over the world.
  const MeshAxis model[3] = {MeshAxis::cp, MeshAxis::ep, MeshAxis::tp};
  for (int i = 0; i < 3; ++i) {
    model_axes_[size_t(i)] = split_groups(world, mesh, {model[i]}, mesh_axis_name(model[i]));
  }
  const bool experts = mesh.size(MeshAxis::ep) > 1;
  for (int i = 0; i < kNumDpGroups; ++i) {
    const DpGroup g = DpGroup(i);
    const bool expert_group = g == DpGroup::expert_dp_shard || g == DpGroup::expert_dp;
    if (expert_group && !experts) continue;  // the same ranks as dp_shard and dp
    const std::string name = dp_group_name(g);
    gather_[size_t(g)] = split_groups(world, mesh, dp_axes(g), name + "/ag");
    reduce_[size_t(g)] = split_groups(world, mesh, dp_axes(g), name + "/rs");
  }
}

MeshCommunicators::~MeshCommunicators() = default;

Communicator& MeshCommunicators::axis(MeshAxis axis) {
  switch (axis) {
    case MeshAxis::dp_outer: return *gather_[size_t(DpGroup::dp_outer)];
    case MeshAxis::dp_shard: return *gather_[size_t(DpGroup::dp_shard)];
    case MeshAxis::cp: return *model_axes_[0];
    case MeshAxis::ep: return *model_axes_[1];
    case MeshAxis::tp: return *model_axes_[2];
  }
  FSDP_THROW(IndexError, "unknown mesh axis ", int(axis));
}

namespace {

// Without expert parallelism the experts' groups are the others.
DpGroup built_group(const Mesh& mesh, DpGroup group) {
  if (mesh.size(MeshAxis::ep) > 1) return group;
  if (group == DpGroup::expert_dp_shard) return DpGroup::dp_shard;
  if (group == DpGroup::expert_dp) return DpGroup::dp;
  return group;
}

}  // namespace

Communicator& MeshCommunicators::all_gather_comm(DpGroup group) {
  return *gather_[size_t(built_group(mesh_, group))];
}

Communicator& MeshCommunicators::reduce_scatter_comm(DpGroup group) {
  return *reduce_[size_t(built_group(mesh_, group))];
}

}  // namespace fsdp
