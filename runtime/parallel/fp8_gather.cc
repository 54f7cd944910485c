#include "runtime/parallel/fp8_gather.h"

#include "kernels/fp8_format.h"
#include "kernels/ops.h"
#include "runtime/core/error.h"
#include "runtime/fsdp/buffer_layout.h"
#include "collectives/collective_calls.h"

namespace fsdp {

bool Fp8GatherCodec::takes(const nn::Parameter& p) const {
  return p.fp8 && p.shape().rank() == 2 && kernels::fp8_shape_ok(16, p.shape()[0], p.shape()[1]);
}

size_t Fp8GatherCodec::state_bytes(const ShardingPlan& plan) const {
  size_t bytes = 0;
  for (const UnitPlan& u : plan.units())
    if (u.encoded()) bytes += buffer_cost(int64_t(u.params.size()), DType::f32);
  return bytes;
}

void Fp8GatherCodec::attach(Context& ctx, std::vector<EncodedUnit> units) {
  FSDP_CHECK(units_.empty(), ValueError, "an FP8 gather codec serves one sharded model");
  int64_t weights = 0;
  const std::vector<Communicator*> groups = units.empty() ? std::vector<Communicator*>()
                                                          : units.front().whole_parameter_groups;
  for (EncodedUnit& e : units) {
    // Every FP8 unit of a rank is split alike, so one set of groups serves all.
    FSDP_CHECK(e.whole_parameter_groups == groups, ValueError,
               "FP8 weight gathers: the units' weights lie over different groups");
    const int64_t n = int64_t(e.params.size());
    units_.push_back({std::move(e), weights, ops::zeros(ctx, Shape{n}, DType::f32)});
    weights += n;
  }
  if (weights > 0) amax_ = ops::zeros(ctx, Shape{weights}, DType::f32);
}

const Fp8GatherCodec::Unit& Fp8GatherCodec::unit(int index) const {
  for (const Unit& u : units_)
    if (u.encoded.unit == index) return u;
  FSDP_THROW(ValueError, "FP8 weight gathers: unit ", index, " is not an FP8 unit");
}

void Fp8GatherCodec::encode(CollectiveCalls& calls, Context& ctx) {
  if (units_.empty()) return;
  // Each weight's amax over its pieces on this rank (0 where it has none), then over the
  // ranks holding the other pieces: every rank then holds the whole weight's amax.
  ops::fill(ctx, amax_, 0.0);
  for (const Unit& u : units_)
    for (const ShardSegment& s : u.encoded.segments)
      ops::fp8_amax(ctx, amax_.narrow(0, u.first + s.param, 1),
                    u.encoded.compute_shard.narrow(0, s.shard_offset, s.numel));
  for (Communicator* c : units_.front().encoded.whole_parameter_groups)
    calls.all_reduce(*c, amax_, ReduceOp::Max, ctx.stream(), 1.0);
  // The amax each weight is scaled by: its own, or under delayed scaling with a history
  // the history's (as the layer would take it: the same on every rank).
  const Tensor scale_amax = ops::clone(ctx, amax_);
  for (const Unit& u : units_) {
    const std::vector<nn::Parameter*>& params = u.encoded.params;
    const int64_t n = int64_t(params.size());
    for (int64_t i = 0; i < n; ++i) {
      const nn::Fp8Recipe& r = params[size_t(i)]->fp8->recipe;
      if (r.scaling == nn::Fp8Scaling::delayed && *r.delayed.primed)
        ops::copy(ctx, scale_amax.narrow(0, u.first + i, 1),
                  r.delayed.scale_amax.narrow(0, int(nn::Fp8Operand::weight), 1));
    }
    // One recipe for every FP8 layer (the plan's), so one format per unit.
    const kernels::Fp8Format format = params.front()->fp8->recipe.forward;
    ops::fp8_scale_inverses(ctx, u.scale_inv, scale_amax.narrow(0, u.first, n), format);
    for (const ShardSegment& s : u.encoded.segments)
      ops::fp8_quantize_flat(ctx, u.encoded.wire_shard.narrow(0, s.shard_offset, s.numel),
                             u.encoded.compute_shard.narrow(0, s.shard_offset, s.numel),
                             scale_amax.narrow(0, u.first + s.param, 1), format);
  }
}

void Fp8GatherCodec::first_micro_batch(Context& ctx) {
  for (const Unit& u : units_) {
    const std::vector<nn::Parameter*>& params = u.encoded.params;
    for (size_t i = 0; i < params.size(); ++i) {
      const nn::Fp8Recipe& r = params[i]->fp8->recipe;
      // The step's amaxes start at zero, and nothing else records a gathered weight's.
      if (r.scaling == nn::Fp8Scaling::delayed)
        ops::copy(ctx, r.delayed.step_amax.narrow(0, int(nn::Fp8Operand::weight), 1),
                  amax_.narrow(0, u.first + int64_t(i), 1));
    }
  }
}

void Fp8GatherCodec::bind(int unit_index, size_t param, nn::Parameter& p, const Tensor& wire) {
  // The layer reads the FP8 bytes and scale (nn::Fp8Weight::bytes); there is no data.
  p.fp8->bytes = wire.view(p.shape());
  p.fp8->scale_inv = unit(unit_index).scale_inv.narrow(0, int64_t(param), 1);
}

void Fp8GatherCodec::unbind(nn::Parameter& p) {
  p.fp8->bytes = Tensor();
  p.fp8->scale_inv = Tensor();
}

}  // namespace fsdp
