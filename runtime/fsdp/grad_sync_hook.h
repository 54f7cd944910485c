// GradSyncHook: what a parallelism that splits parameters over other ranks adds to a sharded
// model's gradients, attached from outside (ShardedModel::add_grad_sync_hook) so that
// runtime/fsdp shards and reduces over its data-parallel groups and knows nothing else.
//
// A hook says three things about each unit:
//   after_reduction  once per step, after the last micro-batch's data-parallel reductions,
//                    on the compute stream: the work the split needs on the unit's reduced
//                    gradients (a sum over its group, a scale), through the counted calls;
//   uncounted        the runs of this rank's shard that other ranks hold too: a norm counts
//                    them on one rank only;
//   split_groups     the groups whose ranks hold the other parts of the unit's parameters: a
//                    sum or a maximum over whole parameters (norms, a gather codec's
//                    scales) reduces over them too.
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/communicator.h"
#include "runtime/core/context.h"
#include "collectives/collective_calls.h"
#include "runtime/fsdp/plan.h"
#include "runtime/nn/parameter.h"

namespace fsdp {

// One unit's gradients as a hook sees them.
struct UnitGradients {
  const UnitPlan& plan;
  const std::vector<nn::Parameter*>& params;   // aligned with plan.params
  const std::vector<ShardSegment>& segments;  // this rank's pieces of them
  Tensor grad_shard;                           // this rank's reduced gradients (shard layout)
};

// A range [offset, offset + numel) of a unit's shard.
struct ShardRun {
  int64_t offset = 0;
  int64_t numel = 0;
};

class GradSyncHook {
 public:
  virtual ~GradSyncHook() = default;
  virtual void after_reduction(const UnitGradients& unit, CollectiveCalls& calls, Context& ctx) {
    (void)unit, (void)calls, (void)ctx;
  }
  virtual void uncounted(const UnitGradients& unit, std::vector<ShardRun>* runs) const {
    (void)unit, (void)runs;
  }
  virtual void split_groups(const UnitPlan& unit, std::vector<Communicator*>* groups) const {
    (void)unit, (void)groups;
  }
};

}  // namespace fsdp
