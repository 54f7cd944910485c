#include <map>

#include "runtime/core/error.h"
#include "runtime/fsdp/plan.h"
#include "tests/test_support.h"

using namespace fsdp;

namespace {

using Units = std::vector<std::pair<std::string, std::vector<ParamSpec>>>;

Units toy_units() {
  return {
      {"root", {{"wte", Shape{100, 8}, true}, {"ln_f.weight", Shape{8}, false}}},
      {"h.0",
       {{"h.0.ln.weight", Shape{8}, false},
        {"h.0.fc.weight", Shape{32, 8}, true},
        {"h.0.fc.bias", Shape{32}, false},
        {"h.0.proj.weight", Shape{8, 32}, true}}},
  };
}

}  // namespace

TEST_CASE("plan lays out decayed parameters first, aligned, padded per dp size", "[fsdp][plan]") {
  for (int dp : {1, 2, 3, 4}) {
    INFO("dp " << dp);
    ShardingPlan plan = ShardingPlan::build(toy_units(), {dp, 256, ShardingStrategy::OptimGradsParams});
    const UnitPlan& h0 = plan.units()[1];
    REQUIRE(h0.params.size() == 4);
    CHECK(h0.params[0].name == "h.0.fc.weight");
    CHECK(h0.params[1].name == "h.0.proj.weight");
    CHECK(h0.params[2].name == "h.0.ln.weight");
    CHECK(h0.params[3].name == "h.0.fc.bias");
    for (const ParamPlacement& p : h0.params) CHECK(p.offset % kParamAlign == 0);
    CHECK(h0.params[1].offset == 256);  // 256 elements of fc.weight, already aligned
    CHECK(h0.params[2].offset == 512);
    CHECK(h0.params[3].offset == 640);
    CHECK(h0.numel == 672);
    CHECK(h0.padded_numel % (dp * 256) == 0);
    CHECK(h0.padded_numel >= h0.numel);
    CHECK(h0.shard_numel * dp == h0.padded_numel);
    CHECK(plan.total_numel() == 800 + 8 + 8 + 256 + 32 + 256);
  }
}

TEST_CASE("every parameter element is owned by exactly one rank", "[fsdp][plan]") {
  for (int dp : {1, 2, 3, 4, 8}) {
    ShardingPlan plan = ShardingPlan::build(toy_units(), {dp, 128, ShardingStrategy::OptimGrads});
    for (const UnitPlan& u : plan.units()) {
      std::map<std::string, std::vector<int>> owner;
      for (const ParamPlacement& p : u.params) owner[p.name].assign(size_t(p.numel), -1);
      for (int r = 0; r < dp; ++r) {
        for (const ShardSegment& s : u.segments(r)) {
          const ParamPlacement& p = u.params[size_t(s.param)];
          CHECK(s.shard_offset + s.numel <= u.shard_numel);
          CHECK(u.shard_begin(r) + s.shard_offset == p.offset + s.param_offset);
          for (int64_t i = 0; i < s.numel; ++i) {
            REQUIRE(owner[p.name][size_t(s.param_offset + i)] == -1);
            owner[p.name][size_t(s.param_offset + i)] = r;
          }
        }
      }
      for (auto& [name, v] : owner)
        for (int o : v) REQUIRE(o >= 0);
    }
  }
}

TEST_CASE("decay ranges cover each shard and follow the parameters' flags", "[fsdp][plan]") {
  for (int dp : {1, 2, 4}) {
    ShardingPlan plan = ShardingPlan::build(toy_units(), {dp, 128, ShardingStrategy::Optim});
    for (const UnitPlan& u : plan.units()) {
      for (int r = 0; r < dp; ++r) {
        int64_t covered = 0;
        for (const DecayRange& d : u.decay_ranges(r)) {
          CHECK(d.shard_offset == covered);
          covered += d.numel;
          // Every parameter element inside the range has the range's decay flag.
          for (const ShardSegment& s : u.segments(r)) {
            const int64_t b = std::max(s.shard_offset, d.shard_offset);
            const int64_t e = std::min(s.shard_offset + s.numel, d.shard_offset + d.numel);
            if (b < e) CHECK(u.params[size_t(s.param)].weight_decay == d.weight_decay);
          }
        }
        CHECK(covered == u.shard_numel);
      }
    }
  }
}

TEST_CASE("plan hash is stable and sensitive to what ranks must agree on", "[fsdp][plan]") {
  const PlanOptions opt{2, 128, ShardingStrategy::OptimGradsParams};
  const uint64_t h = ShardingPlan::build(toy_units(), opt).hash();
  CHECK(ShardingPlan::build(toy_units(), opt).hash() == h);
  Units changed = toy_units();
  changed[1].second[1].shape = Shape{32, 9};
  CHECK(ShardingPlan::build(changed, opt).hash() != h);
  CHECK(ShardingPlan::build(toy_units(), {4, 128, opt.strategy}).hash() != h);
  CHECK(ShardingPlan::build(toy_units(), {2, 128, ShardingStrategy::Optim}).hash() != h);
  Units renamed = toy_units();
  renamed[0].first = "root2";
  CHECK(ShardingPlan::build(renamed, opt).hash() != h);
}

TEST_CASE("plan rejects duplicates and bad options; strategies parse", "[fsdp][plan]") {
  Units dup = toy_units();
  dup[1].second.push_back({"wte", Shape{4}, true});
  CHECK_THROWS_WITH(ShardingPlan::build(dup, {}), Catch::Contains("'wte' appears in more than one unit"));
  CHECK_THROWS_AS(ShardingPlan::build(toy_units(), {0, 128, ShardingStrategy::NoShard}), ConfigError);
  CHECK_THROWS_AS(ShardingPlan::build(toy_units(), {1, 100, ShardingStrategy::NoShard}), ConfigError);
  CHECK(strategy_from_name("3") == ShardingStrategy::OptimGradsParams);
  CHECK(strategy_from_name("optim") == ShardingStrategy::Optim);
  CHECK_THROWS_AS(strategy_from_name("zero3"), ConfigError);
  ShardingPlan plan = ShardingPlan::build(toy_units(), {});
  CHECK(plan.find("h.0.fc.bias") == std::make_pair(1, 3));
  CHECK_THROWS_AS(plan.find("nope"), ValueError);
  CHECK(plan.describe().find("h.0") != std::string::npos);
}
