// FP8 weight gathers (mixed_precision.fp8_param): a gather codec (runtime/fsdp/gather_codec.h)
// under which ZeRO-3 all-gathers the blocks' FP8 weights as FP8 bytes, one byte per element
// with a scale per weight (half of bf16's bytes), and the layers multiply with those bytes
// instead of quantizing the weight themselves.
//
// It takes the weights whose layers run in FP8 (Parameter::fp8, set by apply_fp8) and whose
// products run in FP8 whatever the batch (shapes FP8 tensor cores take). Each weight's scale
// comes from its amax over the ranks holding its pieces (one all-reduce over the shard group
// and one over each split group, per update) or, under delayed scaling with a history, from
// the history, so the bytes equal those the layer would quantize itself. Under delayed
// scaling the step's weight amax is recorded at each step's first micro-batch (the layers,
// reading gathered bytes, record none).
#pragma once

#include <string>
#include <vector>

#include "runtime/fsdp/gather_codec.h"

namespace fsdp {

class Fp8GatherCodec : public GatherCodec {
 public:
  std::string name() const override { return "fp8"; }
  bool takes(const nn::Parameter& p) const override;
  int64_t wire_element_size() const override { return 1; }
  size_t state_bytes(const ShardingPlan& plan) const override;

  void attach(Context& ctx, std::vector<EncodedUnit> units) override;
  void encode(CollectiveCalls& calls, Context& ctx) override;
  void bind(int unit, size_t param, nn::Parameter& p, const Tensor& wire) override;
  void unbind(nn::Parameter& p) override;
  void first_micro_batch(Context& ctx) override;

 private:
  struct Unit {
    EncodedUnit encoded;
    int64_t first = 0;     // its first weight's index in amax_
    Tensor scale_inv;      // (params) f32: each weight's inverse scale, the same on every rank
  };
  std::vector<Unit> units_;
  Tensor amax_;            // (weights) f32: each weight's amax over its ranks, in plan order
  const Unit& unit(int index) const;
};

}  // namespace fsdp
