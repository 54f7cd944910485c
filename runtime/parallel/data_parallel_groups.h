// The data-parallel groups a sharding strategy uses on a device mesh, as fully_shard takes
// them (runtime/fsdp/unit.h): the ZeRO strategies shard over dp_shard and replicate over
// dp_outer (HSDP when dp_outer > 1); no_shard replicates over all of dp. Context-parallel
// ranks join the data-parallel ones. Under expert parallelism the experts are the part
// units ("<block>.experts"), sharded over the ranks holding the same experts; the sliced
// parameters' other slices lie on the tensor-parallel group.
#pragma once

#include "collectives/mesh.h"
#include "runtime/fsdp/sharded_model.h"

namespace fsdp {

// The part units' name under expert parallelism (DataParallelGroups::part_name).
inline constexpr const char* kExpertPartName = "experts";

DataParallelGroups data_parallel_groups(MeshCommunicators& comms, ShardingStrategy strategy);

}  // namespace fsdp
