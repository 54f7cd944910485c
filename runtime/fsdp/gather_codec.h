// GatherCodec: how some weights travel in ZeRO-3's all-gathers, and what the layers compute
// with after a gather, when that is not the compute weights themselves. runtime/fsdp knows
// only this interface; a codec is given from outside (FsdpOptions::gather_codec), by the
// plans of runtime/parallel.
//
// The weights a codec takes go in a unit of their own beside their block's unit
// ("<block>.<codec name>"), gathered and reduced with it. Such an encoded unit keeps master
// weights, compute weights, gradients and optimizer ranges like any other unit; only its
// gathers differ:
//
//   encode   before the first gather after new weights, the codec writes every encoded
//            unit's wire shard (wire_element_size bytes per element of its shard) from the
//            unit's compute shard; the all-gathers send the wire shards;
//   bind     after a gather, each parameter is pointed at its gathered wire bytes (its
//            `data` stays undefined); unbind when the unit reshards;
//   first_micro_batch   at each step's first micro-batch, after encode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/context.h"
#include "runtime/core/tensor.h"
#include "runtime/fsdp/plan.h"
#include "runtime/nn/parameter.h"

namespace fsdp {

class CollectiveCalls;
class Communicator;

// One encoded unit as its codec sees it (laid out by the sharded model).
struct EncodedUnit {
  int unit = 0;                        // its index in the sharding plan
  std::vector<nn::Parameter*> params;  // aligned with the unit plan's params
  std::vector<ShardSegment> segments;  // this rank's pieces of them
  Tensor compute_shard;                // (shard_numel) compute dtype: the weights to encode
  Tensor wire_shard;                   // (shard_numel * wire_element_size) u8: what is sent
  // The groups over which a whole parameter's pieces lie: the shard group, then the groups
  // of the ranks holding its other slices (grad sync hooks' split groups); those that
  // communicate only.
  std::vector<Communicator*> whole_parameter_groups;
};

class GatherCodec {
 public:
  virtual ~GatherCodec() = default;
  // The encoded units' name suffix: block h.3's encoded unit is "h.3.<name>".
  virtual std::string name() const = 0;
  // Whether a block's parameter travels through the codec.
  virtual bool takes(const nn::Parameter& p) const = 0;
  // Bytes per element on the wire and in the gathered buffer.
  virtual int64_t wire_element_size() const = 0;
  // Device bytes the codec keeps for `plan`'s encoded units beside their wire shards (the
  // memory estimate counts them).
  virtual size_t state_bytes(const ShardingPlan& plan) const = 0;

  // Once, when the sharded model has laid out its encoded units (in plan order).
  virtual void attach(Context& ctx, std::vector<EncodedUnit> units) = 0;
  // Writes every encoded unit's wire shard from its compute shard, on ctx's stream; its
  // collectives go through `calls`.
  virtual void encode(CollectiveCalls& calls, Context& ctx) = 0;
  // Points parameter `param` (index in its unit) of encoded unit `unit` at its gathered
  // wire bytes; unbind forgets them.
  virtual void bind(int unit, size_t param, nn::Parameter& p, const Tensor& wire) = 0;
  virtual void unbind(nn::Parameter& p) = 0;
  virtual void first_micro_batch(Context& ctx) { (void)ctx; }
};

}  // namespace fsdp
