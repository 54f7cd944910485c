// The gradient work of the parallelisms that split parameters over other ranks, attached
// to a sharded model as grad sync hooks (runtime/fsdp/grad_sync_hook.h):
//
//   sharded->add_grad_sync_hook(std::make_unique<TensorParallelGradSync>(&tp_comm));
//   sharded->add_grad_sync_hook(std::make_unique<ExpertParallelGradSync>(&ep_comm));
#pragma once

#include <vector>

#include "collectives/communicator.h"
#include "runtime/fsdp/grad_sync_hook.h"

namespace fsdp {

// Tensor parallelism (apply_tensor_parallel): after the data-parallel reduction, the
// gradients of parameters marked Placement::partial_grad (each rank computed a part of
// them: sequence parallelism, the vocabulary-parallel head's positions) are summed over the
// group, one all-reduce per unit; rows several ranks hold (replicated key/value heads) add
// the parts each computed, one all-gather per unit. For norms, a parameter every rank holds
// whole counts on the group's first rank, a replicated row on its owner, and every unit's
// sums go over the group.
class TensorParallelGradSync : public GradSyncHook {
 public:
  explicit TensorParallelGradSync(Communicator* group) : group_(group) {}
  void after_reduction(const UnitGradients& unit, CollectiveCalls& calls, Context& ctx) override;
  void uncounted(const UnitGradients& unit, std::vector<ShardRun>* runs) const override;
  void split_groups(const UnitPlan& unit, std::vector<Communicator*>* groups) const override;

 private:
  Communicator* group_;
};

// Expert parallelism (apply_expert_parallel): each reduction averaged over its own group,
// and an expert's gradient holds the tokens of every expert-parallel rank (the exchanges
// brought them), so its mean over the expert-data-parallel group is ep times the mean over
// all data-parallel ranks: the experts units' gradients are scaled by 1 / ep. Their norms
// are summed over the expert-parallel group, whose ranks hold the other experts.
class ExpertParallelGradSync : public GradSyncHook {
 public:
  explicit ExpertParallelGradSync(Communicator* group) : group_(group) {}
  void after_reduction(const UnitGradients& unit, CollectiveCalls& calls, Context& ctx) override;
  void split_groups(const UnitPlan& unit, std::vector<Communicator*>* groups) const override;

 private:
  Communicator* group_;
};

}  // namespace fsdp
