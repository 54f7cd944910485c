// logger.log_update_norms: the size of each optimizer step, per tensor group. Before the
// step the master-weight shards are copied; after it, ||new - old|| is summed per parameter
// over the shard group and gathered into groups of the same tensor in every layer.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "runtime/core/context.h"
#include "runtime/fsdp/sharded_model.h"

namespace fsdp::train {

// The group of a parameter: its name with every all-digit component replaced by '*'
// ("h.3.attn.qkv.weight" -> "h.*.attn.qkv.weight").
std::string tensor_group(const std::string& param_name);

class UpdateNorms {
 public:
  UpdateNorms(Context& ctx, ShardedModel& model);
  void before_step();  // copies the master-weight shards
  // ||new - old|| per tensor group, the same on every rank. Collective over the shard group.
  std::map<std::string, double> after_step();

 private:
  Context& ctx_;
  ShardedModel& model_;
  std::vector<Tensor> before_;  // per unit: (shard) master weights before the step
  std::vector<std::string> groups_;  // per parameter in plan order: its tensor group
};

}  // namespace fsdp::train
