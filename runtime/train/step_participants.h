// The trainer's step participants (step_participant.h), one per feature that takes part in
// every step.
#pragma once

#include <memory>

#include "collectives/communicator.h"
#include "collectives/mesh.h"
#include "runtime/fsdp/sharded_model.h"
#include "runtime/parallel/fp8_delayed_scaling.h"
#include "runtime/parallel/fp8_plan.h"
#include "runtime/train/moe_step.h"
#include "runtime/train/step_participant.h"
#include "runtime/train/update_norms.h"

namespace fsdp::train {

// The MoE layers: their losses and loads summed over the ranks into the step's metrics, the
// expert biases moved after each update, and (expert parallelism) the expert collectives a
// rank issued over the run.
class MoeParticipant : public StepParticipant {
 public:
  // `comms`: the mesh's communicators when experts are split over ranks (null otherwise).
  MoeParticipant(std::unique_ptr<MoeStep> moe, MeshCommunicators* comms);
  void start_step(Context& ctx) override;
  std::vector<double> local_values(Context& ctx) override;
  void after_optimizer_step(Context& ctx, const std::vector<double>& summed, double forwards,
                            StepMetrics& m) override;
  void report(TrainResult& result) const override;

 private:
  struct ExpertCounts {
    uint64_t all_to_alls = 0, all_gathers = 0, reduce_scatters = 0;
  };
  ExpertCounts expert_counts() const;
  std::unique_ptr<MoeStep> moe_;
  MeshCommunicators* comms_;
  ExpertCounts at_start_;
  bool started_ = false;
  TrainResult::Moe series_;
};

// mixed_precision.fp8: what the FP8 plan marked (reported), and under delayed scaling the
// amax histories, which start each step and take the step's amaxes over every rank once the
// gradients are reduced.
class Fp8Participant : public StepParticipant {
 public:
  // `delayed`: null unless fp8_recipe is "delayed"; `world`: every rank (null: one process).
  Fp8Participant(const Fp8Report& plan, Fp8DelayedScaling* delayed, Communicator* world);
  void start_step(Context& ctx) override;
  void after_grad_sync(Context& ctx) override;
  void after_optimizer_step(Context& ctx, const std::vector<double>& summed, double forwards,
                            StepMetrics& m) override;
  void report(TrainResult& result) const override;

 private:
  // Drops the FP8 weights' cached casts (nn::Fp8Recipe::cache_weight): at each step's
  // start and after each update.
  void clear_weight_casts();

  Fp8Report plan_;
  Fp8DelayedScaling* delayed_;
  Communicator* world_;
};

// logger.log_update_norms: the master weights copied before the update, ||new - old|| per
// tensor group after it.
class UpdateNormsParticipant : public StepParticipant {
 public:
  UpdateNormsParticipant(Context& ctx, ShardedModel& sharded) : norms_(ctx, sharded) {}
  void after_grad_sync(Context& ctx) override;
  void after_optimizer_step(Context& ctx, const std::vector<double>& summed, double forwards,
                            StepMetrics& m) override;

 private:
  UpdateNorms norms_;
};

}  // namespace fsdp::train
