// The checkpoints of one training run: which one it resumes from, and when it saves.
//
// Resuming (TrainerOptions::resume and checkpoint.load): "latest" resumes from the save
// directory's newest complete checkpoint if there is one (else the run starts fresh); a
// directory resumes from that checkpoint, or from the newest in that save directory (an
// error if it holds neither); null starts fresh. A resume restores the master weights, the
// optimizer's moments and step count, the MoE layers' expert biases, the FP8 amax
// histories, the step, and the data loader's position, so that a run resumed with the same
// world size continues bit for bit. A resume with another dataset.seed than the checkpoint's
// is refused (ConfigError naming the key and both values), as the data order depends on it,
// unless the checkpoint has read no data yet (an import).
// Any other world size, strategy and expert-parallel size may resume too (the checkpoint is
// resharded on load; experts are stored by their global index).
//
// Saving (checkpoint.save set): every checkpoint.save_interval steps, after the last step,
// and when a stop was requested (SIGTERM, SIGUSR1), keeping checkpoint.most_recent_k.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "collectives/mesh.h"
#include "collectives/communicator.h"
#include "runtime/core/context.h"
#include "runtime/data/data_loader.h"
#include "runtime/fsdp/sharded_model.h"
#include "runtime/optim/optimizer.h"
#include "runtime/parallel/fp8_delayed_scaling.h"
#include "runtime/train/recipe.h"

namespace fsdp::train {

// What a run's checkpoints are made of: references to the trainer's own objects.
struct CheckpointedParts {
  Context* ctx = nullptr;
  Communicator* world = nullptr;  // every rank of the job
  const Mesh* mesh = nullptr;
  DataParallelGroups groups;      // the groups the model was sharded with
  ShardedModel* model = nullptr;
  Optimizer* optimizer = nullptr;
  data::DataLoader* train_data = nullptr;
  Fp8DelayedScaling* fp8 = nullptr;  // the FP8 amax histories (delayed recipe only)
};

class RunCheckpoints {
 public:
  // `print` receives the lines rank 0 should show (resumed from..., saved...).
  RunCheckpoints(const Recipe& recipe, const CheckpointedParts& parts,
                 std::function<void(const std::string&)> print);

  // checkpoint.save: on every rank, the directory exists (created if needed) and takes a
  // file, checked at start-up rather than at the first save, after steps were spent.
  // ConfigError naming the key and the rank otherwise, on every rank. Collective.
  void check_save_directory();

  // After resume() (or none): a run that did not resume from checkpoint.save's own
  // checkpoints is refused when that directory holds some (its saves would replace and
  // prune another run's), unless checkpoint.overwrite. ConfigError naming the directory on
  // every rank. Collective.
  void refuse_foreign_checkpoints() const;

  // The checkpoint directory this run would resume from ("" = start fresh). ConfigError if
  // checkpoint.load names a path that holds no checkpoint. With checkpoint.load "latest" and
  // no `latest` marker, the save directory's newest complete step (and says so).
  std::string resume_directory() const;

  // Loads resume_directory() (if any) into the model, the optimizer and the data loader;
  // returns the step the run continues after, or nullopt when it starts fresh. Collective.
  std::optional<int64_t> resume();

  // After step `step` completed: saves if it is a save_interval step or `final` (the last
  // step, or a stop was requested), unless this step is saved already. A failed save throws
  // on every rank, unless checkpoint.continue_on_save_failure and not `final`: then it warns
  // and returns (the previous checkpoint stays latest). Collective; every rank passes the
  // same arguments.
  void after_step(int64_t step, bool final);

 private:
  void save(int64_t step);

  Recipe recipe_;
  CheckpointedParts parts_;
  std::function<void(const std::string&)> print_;
  int64_t last_saved_step_ = -1;
  std::string resumed_from_;  // the checkpoint resume() loaded, "" when none
};

}  // namespace fsdp::train
