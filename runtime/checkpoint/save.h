// Saving a sharded checkpoint: atomically, and agreed by every rank.
//
//   SAVE_DIR/
//     step_000100/             one complete checkpoint (see metadata.h for its contents)
//       metadata.json
//       shard_00000_of_00002.safetensors
//       shard_00001_of_00002.safetensors
//     step_000200/
//     latest                   "step_000200": the newest complete checkpoint
//
// A save writes everything into SAVE_DIR/.tmp_step_000200, flushes every file and the
// directory to disk, renames it to step_000200, and only then replaces `latest` (write a
// temporary, fsync, rename over). Each phase is agreed by every rank before the next
// begins: rank 0 renames only after every shard file is written, and moves `latest` only
// after the rename. A crash or kill at any point leaves `latest` naming the previous
// complete checkpoint; the next save clears the debris of an interrupted one. Older
// checkpoints beyond `most_recent_k` are deleted after `latest` moved. Saving a step that
// is saved already (a fresh run into an old save directory) replaces it; meanwhile
// `latest` names the newest other checkpoint.
//
// Each shard of the sharded state is written by one rank: the first replica of that shard
// (replicas hold identical shards under no_shard and HSDP). Under expert parallelism a rank
// holds a shard of the dense units and one of its expert-parallel rank's experts units, each
// replicated over its own group: it writes one file with those it holds the first replica of.
// The model's buffers (expert biases), the same on every rank, go into rank 0's file.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/core/context.h"
#include "runtime/fsdp/sharded_model.h"
#include "runtime/optim/optimizer.h"

namespace fsdp::checkpoint {

// What, besides the model and optimizer state, a resume needs (recorded in metadata.json).
struct TrainingProgress {
  int64_t step = 0;  // optimizer steps completed
  int64_t consumed_samples = 0;
  int64_t consumed_tokens = 0;
  uint64_t init_seed = 0;      // parameter initialization
  uint64_t data_seed = 0;      // sample shuffling
  std::string mesh;            // the device mesh, as Mesh::str() prints it
  std::string recipe_json = "null";  // the resolved recipe, a JSON object
};

// A buffer of the model (see metadata.h): training state that is not a parameter (an MoE
// layer's expert bias), the same on every rank.
struct ModelBuffer {
  std::string name;  // "layers.1.mlp.expert_bias"
  Tensor tensor;     // what a save writes; what a load writes into (any device and shape)
  // A load from a checkpoint without it (saved by a run that did not keep it) leaves its
  // value instead of refusing: state that a run may start afresh (FP8 amax histories).
  bool optional = false;
  // The recipe key its shape follows, named when a checkpoint's shape differs ("" if none).
  std::string shape_key;
};

struct SaveOptions {
  // Complete checkpoints to keep (the newest by step); 0 keeps all.
  int most_recent_k = 0;
  // For tests of interrupted saves: called on the ranks that reach each named point of a
  // save ("shard_file_opened", "tensor_written:<name>" after each tensor's bytes,
  // "shard_file_written", "metadata_written", "renamed", "latest_written"). A hook that
  // throws simulates a failure there; one that ends the process, a kill.
  std::function<void(const std::string& point)> fault_hook;
  // The model's buffers, saved from rank 0 (every rank passes the same names).
  std::vector<ModelBuffer> buffers;
};

struct SaveResult {
  std::string directory;  // SAVE_DIR/step_000100
  uint64_t bytes = 0;     // of every file written, over all ranks
  std::string warning;    // old checkpoints that could not be deleted (the save succeeded)
};

// Saves `model`'s master weights and `optimizer`'s state (null: weights only) at
// progress.step into save_dir. Collective over `comm`, the communicator of every rank of the
// job (null: a single process); `groups` are the data-parallel groups the model was sharded
// with. On any rank's failure every rank throws (CheckpointError or IoError) and `latest`
// is unchanged.
SaveResult save_checkpoint(Context& ctx, Communicator* comm, const ShardedModel& model,
                           const Optimizer* optimizer, const DataParallelGroups& groups,
                           const TrainingProgress& progress, const std::string& save_dir,
                           const SaveOptions& options = SaveOptions());

// The name the `latest` marker of save_dir holds ("step_000100"), or "" when there is none.
std::string read_latest_marker(const std::string& save_dir);

}  // namespace fsdp::checkpoint
