// Loading a native checkpoint into a sharded model and its optimizer, whatever layout it was
// saved with (world size, strategy, shard size): each rank reads, as slices of the shard
// files, only the elements of its own shards.
//
// All or nothing. The load runs in phases, each agreed by every rank before the next:
//   1. metadata.json parsed and checked; the model must have exactly the checkpoint's
//      parameters with the same shapes (CheckpointError naming the first that differs);
//      the optimizers must agree; every shard file is present with its recorded size;
//   2. every file's SHA-256 is verified, the files spread over the ranks (file i by rank
//      i mod world size), so each byte is hashed once and nothing is gathered on one rank;
//   3. every rank reads its shards' state into host staging buffers;
//   4. only then is the staged state copied into the model and the optimizer, and the
//      compute weights are rebuilt from the master weights.
// A failure in phases 1-3 on any rank throws on every rank and leaves the model and the
// optimizer as they were. Nothing is ever written to the checkpoint directory.
#pragma once

#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/checkpoint/metadata.h"
#include "runtime/checkpoint/save.h"
#include "runtime/core/context.h"
#include "runtime/fsdp/sharded_model.h"
#include "runtime/optim/optimizer.h"

namespace fsdp::checkpoint {

struct LoadOptions {
  // Verify the SHA-256 of every shard file (spread over the ranks).
  bool verify_checksums = true;
  // The model's buffers (expert biases), written from the checkpoint's on every rank. A
  // checkpoint of step 0 (an import, initial weights) may lack one, which then keeps its
  // value; after training steps a missing buffer is refused, as it would be lost state.
  std::vector<ModelBuffer> buffers;
};

// Loads checkpoint `dir` (a step directory: see find_checkpoint()) into `model` and, unless
// null, `optimizer` (its moments and step count). Collective over `comm` (every rank of the
// job; null: one process). Returns the checkpoint's metadata, from which the caller restores
// what lives outside the model: the step, the data position, the recipe.
//
// A weights-only checkpoint (no optimizer state, e.g. an import) loads into a fresh
// optimizer state (zero moments, step count 0). A checkpoint whose optimizer differs from
// `optimizer`'s kind after some steps is refused. Expert-parallel experts and the other
// units' shards are read by global coordinates too: any expert-parallel layout loads any
// other, and checkpoints without expert parallelism load into one with it.
CheckpointMetadata load_checkpoint(Context& ctx, Communicator* comm, ShardedModel& model,
                                   Optimizer* optimizer, const std::string& dir,
                                   const LoadOptions& options = LoadOptions());

// Checks that `metadata` describes exactly the parameters of `plan` (placed from `model`'s)
// with the same whole shapes (a tensor-parallel slice's full shape): CheckpointError naming
// `dir` and the first parameter, in plan order, that is missing, extra or of another shape.
void check_model_matches(const CheckpointMetadata& metadata, const ShardingPlan& plan,
                         nn::Module& model, const std::string& dir);

}  // namespace fsdp::checkpoint
