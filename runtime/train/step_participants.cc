#include "runtime/train/step_participants.h"

#include <utility>

namespace fsdp::train {

// ---------------------------------------------------------------- MoE

MoeParticipant::MoeParticipant(std::unique_ptr<MoeStep> moe, MeshCommunicators* comms)
    : moe_(std::move(moe)), comms_(comms) {}

MoeParticipant::ExpertCounts MoeParticipant::expert_counts() const {
  if (!comms_) return {};
  return {comms_->axis(MeshAxis::ep).counts().all_to_all,
          comms_->all_gather_comm(DpGroup::expert_dp_shard).counts().all_gather,
          comms_->reduce_scatter_comm(DpGroup::expert_dp_shard).counts().reduce_scatter};
}

void MoeParticipant::start_step(Context& ctx) {
  (void)ctx;
  // The run's counts start with its first step (set-up and a resumed load excluded).
  if (!started_) at_start_ = expert_counts();
  started_ = true;
  moe_->start_step();
}

std::vector<double> MoeParticipant::local_values(Context& ctx) { return moe_->local_values(ctx); }

void MoeParticipant::after_optimizer_step(Context& ctx, const std::vector<double>& summed,
                                          double forwards, StepMetrics& m) {
  moe_->finish_step(ctx, summed, forwards, m);
  if (!m.moe_aux_loss) return;
  series_.aux_losses.push_back(*m.moe_aux_loss);
  series_.z_losses.push_back(*m.moe_z_loss);
  series_.max_loads.push_back(*m.moe_max_load);
}

void MoeParticipant::report(TrainResult& result) const {
  result.moe = series_;
  const ExpertCounts now = expert_counts();
  result.moe.expert_all_to_alls = now.all_to_alls - at_start_.all_to_alls;
  result.moe.expert_all_gathers = now.all_gathers - at_start_.all_gathers;
  result.moe.expert_reduce_scatters = now.reduce_scatters - at_start_.reduce_scatters;
}

// ---------------------------------------------------------------- FP8

Fp8Participant::Fp8Participant(const Fp8Report& plan, Fp8DelayedScaling* delayed,
                               Communicator* world)
    : plan_(plan), delayed_(delayed), world_(world) {}

void Fp8Participant::clear_weight_casts() {
  for (nn::Parameter* w : plan_.fp8_weights) w->fp8->cast.reset();
}

void Fp8Participant::start_step(Context& ctx) {
  // A cast made since the update (an evaluation's) is made again, so that the step's first
  // product records the weight's amax under delayed scaling.
  clear_weight_casts();
  if (delayed_) delayed_->start_step(ctx);
}

void Fp8Participant::after_grad_sync(Context& ctx) {
  // The step's amaxes, over every rank, into the histories the next step scales by.
  if (delayed_) delayed_->finish_step(ctx, world_);
}

void Fp8Participant::after_optimizer_step(Context& ctx, const std::vector<double>& summed,
                                          double forwards, StepMetrics& m) {
  (void)ctx, (void)summed, (void)forwards;
  clear_weight_casts();  // (Fp8Recipe::cache_weight: cast again from the new weights)
  m.fp8_layers = int64_t(plan_.fp8_layers.size());
}

void Fp8Participant::report(TrainResult& result) const {
  result.fp8.layers = plan_.fp8_layers;
  result.fp8.bf16_blocks = plan_.bf16_blocks;
  result.fp8.bf16_layers = plan_.bf16_layers;
  result.fp8.classifier = plan_.classifier;
}

// ---------------------------------------------------------------- update norms

void UpdateNormsParticipant::after_grad_sync(Context& ctx) {
  (void)ctx;
  norms_.before_step();
}

void UpdateNormsParticipant::after_optimizer_step(Context& ctx, const std::vector<double>& summed,
                                                  double forwards, StepMetrics& m) {
  (void)ctx, (void)summed, (void)forwards;
  m.update_norms = norms_.after_step();
}

}  // namespace fsdp::train
