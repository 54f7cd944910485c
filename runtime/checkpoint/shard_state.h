// The per-rank training state a checkpoint holds, seen unit by unit: for each unit of a
// ShardedModel, this rank's shard of the master weights and of Adam's two moments, each as
// one flat range of shard_numel elements.
//
// The model keeps the master weights per unit already; the optimizer keeps its moments per
// OptimizerRange (one per weight-decay range of each unit's shard, in unit order). This
// file maps between the two, checking that every optimizer range is a view of its unit's
// master-weight shard where it is expected to be.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"
#include "runtime/fsdp/sharded_model.h"
#include "runtime/optim/optimizer.h"

namespace fsdp::checkpoint {

class ShardState {
 public:
  // `optimizer` may be null (weights only). InternalError if the optimizer's ranges are not
  // the model's optimizer_ranges().
  ShardState(const ShardedModel& model, const Optimizer* optimizer);

  // "main", plus "exp_avg" and "exp_avg_sq" for an AdamW optimizer.
  std::vector<std::string> kinds() const;
  DType dtype(const std::string& kind) const;
  int64_t shard_numel(int unit) const;

  // Unit u's state `kind` copied to one contiguous host tensor of shard_numel(u) elements.
  Tensor to_host(Context& ctx, int unit, const std::string& kind) const;
  // The inverse: writes `host` (shard_numel(u) elements, any floating dtype: converted)
  // into unit u's state `kind`.
  void from_host(Context& ctx, int unit, const std::string& kind, const Tensor& host) const;

 private:
  struct Piece {
    size_t range = 0;          // index into the optimizer's ranges
    int64_t shard_offset = 0;  // where the range starts in the unit's shard
    int64_t numel = 0;
  };
  std::vector<Tensor> main_;                // per unit
  std::vector<std::vector<Piece>> pieces_;  // per unit: its optimizer ranges
  const Optimizer* optimizer_;
};

}  // namespace fsdp::checkpoint
