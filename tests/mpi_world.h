// The set-up every multi-rank CPU test shares: one MPI world (quiet), its flat mesh of
// world-size data-parallel ranks, and the mesh's communicators. Tests run the same binary
// alone and under `mpirun -np N` (fsdp_test's mpi_ranks), so the world may have one rank.
#pragma once

#include "collectives/mesh.h"
#include "collectives/world.h"
#include "runtime/fsdp/sharded_model.h"
#include "runtime/parallel/data_parallel_groups.h"

namespace fsdp::testing {

inline WorldOptions quiet_mpi_world() {
  WorldOptions o;
  o.backend = Backend::Mpi;
  o.print_summary = false;
  return o;
}

struct MpiWorld {
  MpiWorld() : world(quiet_mpi_world()), mesh({1, world.size(), 1, 1, 1}, world.size()), comms(world, mesh) {}

  int rank() const { return world.rank(); }
  int size() const { return world.size(); }
  // The data-parallel groups a strategy shards and replicates over on this mesh.
  DataParallelGroups groups(ShardingStrategy s) { return data_parallel_groups(comms, s); }

  World world;
  Mesh mesh;
  MeshCommunicators comms;
};

}  // namespace fsdp::testing
