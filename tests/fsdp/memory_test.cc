// The memory each rank holds for a sharded model, from the plan alone: at ZeRO-3 the
// persistent bytes per parameter are (2 bf16 weights + 4 f32 main + 4 f32 gradients +
// 8 Adam) / N = 18 / N, and 16 / N with bf16 gradients (ZeRO-3's persistent budget per rank).
#include <algorithm>

#include "models/factory.h"
#include "runtime/fsdp/buffer_layout.h"
#include "runtime/fsdp/memory.h"
#include "tests/test_support.h"

using namespace fsdp;

namespace {

// Persistent bytes per (unpadded) parameter on one rank; `padding` receives padded/unpadded.
double persistent_bytes_per_param(const models::ModelConfig& c, int dp, DType grads,
                                  ShardingStrategy s = ShardingStrategy::OptimGradsParams,
                                  double* padding = nullptr) {
  auto model = models::build_model(c);
  FsdpOptions o;
  o.strategy = s;
  o.compute_dtype = DType::bf16;
  o.main_dtype = DType::f32;
  o.grad_dtype = grads;
  o.reduce_dtype = grads;
  PlanOptions po;
  po.dp_size = s == ShardingStrategy::NoShard ? 1 : dp;
  po.block = o.shard_block;
  po.strategy = s;
  const ShardingPlan plan = ShardingPlan::build(unit_specs(*model, unit_module_kind(o.unit_kind)), po);
  const MemoryBreakdown m = estimate_memory(plan, o);
  const size_t adam = optimizer_state_bytes(plan, OptimizerKind::adamw, DType::f32);
  if (padding) *padding = double(plan.total_padded_numel()) / double(plan.total_numel());
  return double(m.compute_weights + m.main_weights + m.grad_accumulation + m.full_grads + adam) /
         double(model->num_parameters());
}

}  // namespace

TEST_CASE("ZeRO-3 keeps 18/N bytes per parameter (16/N with bf16 gradients)", "[fsdp][memory]") {
  const models::ModelConfig gpt2 = models::gpt2_config(12);
  for (int n : {1, 2, 4, 8, 64}) {
    INFO("N = " << n);
    double padding = 0;
    // 18 (16) bytes per element of the padded flat buffers, over N ranks, plus the
    // allocator's rounding of each of the five allocations (master weights, compute weights,
    // gradient shards, two Adam moments), at most 2 MiB each...
    const double f32_grads = persistent_bytes_per_param(gpt2, n, DType::f32,
                                                        ShardingStrategy::OptimGradsParams, &padding);
    const double rounding = 5.0 * (2 << 20) / 124475904.0;
    CHECK(f32_grads >= 18.0 / n * padding);
    CHECK(f32_grads <= 18.0 / n * padding + rounding);
    const double bf16_grads = persistent_bytes_per_param(gpt2, n, DType::bf16);
    CHECK(bf16_grads >= 16.0 / n * padding);
    CHECK(bf16_grads <= 16.0 / n * padding + rounding);
    // ...and the padding (each unit rounded up to N * 4096 elements) stays small: 13 units of
    // GPT-2 d12 waste at most 13 * N * 4096 elements of 124M.
    CHECK(padding >= 1.0);
    CHECK(padding <= 1.0 + 13.0 * n * 4096 / 124475904.0);
    if (n <= 8) CHECK(padding < 1.005);
  }
}

TEST_CASE("what each strategy keeps per parameter", "[fsdp][memory]") {
  const models::ModelConfig gpt2 = models::gpt2_config(12);
  const int n = 4;
  // (Each within 1%: the allocator's rounding of a handful of allocations.)
  // no_shard: 2 weights + 4 main + 4 gradients + 8 Adam, all replicated.
  CHECK(persistent_bytes_per_param(gpt2, n, DType::f32, ShardingStrategy::NoShard) ==
        Approx(18.0).epsilon(0.01));
  // ZeRO-1: full weights and gradients; main weights and Adam sharded (plus the gradient
  // shard the reduce-scatter fills).
  CHECK(persistent_bytes_per_param(gpt2, n, DType::f32, ShardingStrategy::Optim) ==
        Approx(2 + 4 + (4 + 8 + 4) / double(n)).epsilon(0.01));
  // ZeRO-2: full weights; gradients sharded too.
  CHECK(persistent_bytes_per_param(gpt2, n, DType::f32, ShardingStrategy::OptimGrads) ==
        Approx(2 + (4 + 4 + 8) / double(n)).epsilon(0.01));
}

TEST_CASE("nccl_ub: registrable buffers cost whole 2 MiB granules, plus the reduce staging",
          "[fsdp][memory]") {
  auto model = models::build_model(models::gpt2_config(12));
  for (ShardingStrategy s : {ShardingStrategy::Optim, ShardingStrategy::OptimGrads,
                             ShardingStrategy::OptimGradsParams}) {
    for (DType grads : {DType::f32, DType::bf16}) {
      INFO(strategy_name(s) << " grads " << dtype_name(grads));
      FsdpOptions o;
      o.strategy = s;
      o.compute_dtype = DType::bf16;
      o.grad_dtype = grads;
      o.reduce_dtype = DType::f32;  // bf16 gradients are cast before the reduction
      PlanOptions po;
      po.dp_size = 2;
      po.strategy = s;
      const ShardingPlan plan = ShardingPlan::build(unit_specs(*model, unit_module_kind(o.unit_kind)), po);
      const MemoryBreakdown off = estimate_memory(plan, o);
      o.nccl_ub = true;
      const MemoryBreakdown on = estimate_memory(plan, o);
      const size_t granule = size_t(2) << 20;
      // Buffers no collective touches are unchanged.
      CHECK(on.main_weights == off.main_weights);
      CHECK(on.compute_weights % granule == 0);
      CHECK(on.compute_weights >= off.compute_weights);
      CHECK(on.compute_weights < off.compute_weights + granule);
      const bool zero3 = s == ShardingStrategy::OptimGradsParams;
      if (zero3) {
        CHECK(on.gather_pool % granule == 0);
        CHECK(on.gather_pool >= off.gather_pool);
      }
      if (s == ShardingStrategy::Optim) {
        CHECK(on.full_grads % granule == 0);
        CHECK(on.grad_pool == off.grad_pool);
      } else {
        // The pools and root buffers in granules, plus the reduce-scatter output (the largest
        // shard, f32) and, for bf16 gradients, its f32 input (the largest unit).
        const ReduceStaging staging = reduce_staging(plan, o);
        int64_t max_shard = 0, max_unit = 0;
        for (const UnitPlan& u : plan.units()) {
          max_shard = std::max(max_shard, u.shard_numel);
          max_unit = std::max(max_unit, u.padded_numel);
        }
        CHECK(staging.out_numel == max_shard);
        CHECK(staging.in_numel == (grads == DType::f32 ? 0 : max_unit));
        CHECK(on.grad_pool % granule == 0);
        CHECK(on.grad_pool >= off.grad_pool + size_t(max_shard) * 4 +
                                   (grads == DType::f32 ? 0 : size_t(max_unit) * 4));
      }
      // Nothing changes without a second rank to talk to.
      PlanOptions single = po;
      single.dp_size = 1;
      const ShardingPlan one = ShardingPlan::build(unit_specs(*model, unit_module_kind(o.unit_kind)), single);
      o.nccl_ub = false;
      const MemoryBreakdown one_off = estimate_memory(one, o);
      o.nccl_ub = true;
      CHECK(estimate_memory(one, o).total() == one_off.total());
    }
  }
}
