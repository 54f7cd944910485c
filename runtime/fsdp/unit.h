// The per-unit state of a ShardedModel (private to runtime/fsdp).
#pragma once

#include <string>
#include <vector>

#include "runtime/core/stream.h"
#include "runtime/core/tensor.h"
#include "runtime/fsdp/plan.h"
#include "runtime/fsdp/sharded_model.h"
#include "runtime/nn/module.h"

namespace fsdp {

struct ShardedModel::Unit {
  int index = 0;
  std::string name;
  std::vector<nn::Module*> modules;      // the unit's blocks in forward order, or the model
  const UnitPlan* plan = nullptr;
  std::vector<nn::Parameter*> params;    // aligned with plan->params

  // Persistent buffers (see the table in sharded_model.h).
  Tensor compute_full;   // full compute weights: persistent unless ZeRO-3
  Tensor compute_shard;  // this rank's compute weights (a view of compute_full unless ZeRO-3)
  Tensor main;           // this rank's master weights
  Tensor grad_full;      // full gradients written by backward (persistent: no_shard, optim)
  Tensor grad_accum;     // accumulated gradients (full: no_shard/optim; shard: ZeRO-2/3)
  Tensor grad_shard;     // the reduced gradient the optimizer reads
  Tensor root_gathered;  // ZeRO-3 root: gathered weights, held for the whole step
  Tensor root_grad;      // ZeRO-2/3 root: full gradients, held through the backward

  // Schedule state.
  bool gather_issued = false;  // an all-gather (ZeRO-3) or install gather is in flight or done
  bool bound = false;          // params' data point at gathered weights
  Event gathered;              // recorded on the gather stream after the gather
  Event released;              // compute stream, after the last use of root_gathered
  int gather_slot = -1;        // pool slot holding the gathered weights (ZeRO-3 blocks)
  int grad_slot = -1;          // pool slot holding the full gradients (ZeRO-2/3 blocks)
};

}  // namespace fsdp
