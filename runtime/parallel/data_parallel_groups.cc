#include "runtime/parallel/data_parallel_groups.h"

namespace fsdp {

DataParallelGroups data_parallel_groups(MeshCommunicators& comms, ShardingStrategy strategy) {
  const Mesh& mesh = comms.mesh();
  DataParallelGroups g;
  g.part_name = kExpertPartName;
  if (mesh.size(MeshAxis::tp) > 1) g.slices = &comms.axis(MeshAxis::tp);
  // Context-parallel ranks join the data-parallel ones (their groups span dp x cp).
  const int cp = mesh.size(MeshAxis::cp);
  if (strategy == ShardingStrategy::NoShard) {
    if (mesh.dp_size() * cp > 1) g.replicate = &comms.reduce_scatter_comm(DpGroup::dp);
    if (mesh.size(MeshAxis::ep) > 1) {
      g.parts = &comms.axis(MeshAxis::ep);
      if (mesh.dp_size() / mesh.size(MeshAxis::ep) * cp > 1)
        g.part_replicate = &comms.reduce_scatter_comm(DpGroup::expert_dp);
    }
    return g;
  }
  const int ep = mesh.size(MeshAxis::ep);
  if (mesh.size(MeshAxis::dp_shard) * cp * ep > 1) {
    g.shard_gather = &comms.all_gather_comm(DpGroup::dp_shard);
    g.shard_reduce = &comms.reduce_scatter_comm(DpGroup::dp_shard);
  }
  if (mesh.size(MeshAxis::dp_outer) > 1) g.replicate = &comms.reduce_scatter_comm(DpGroup::dp_outer);
  if (ep > 1) {
    // Expert parallelism: the ranks that hold the same experts are the data-parallel ones
    // without the ep axis (the dense groups above span it).
    g.parts = &comms.axis(MeshAxis::ep);
    if (mesh.size(MeshAxis::dp_shard) * cp > 1) {
      g.part_shard_gather = &comms.all_gather_comm(DpGroup::expert_dp_shard);
      g.part_shard_reduce = &comms.reduce_scatter_comm(DpGroup::expert_dp_shard);
    }
    g.part_replicate = g.replicate;  // dp_outer: the same ranks for both
  }
  return g;
}

}  // namespace fsdp
