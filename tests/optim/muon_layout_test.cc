// Muon's layout over a sharding plan (runtime/optim/muon_layout.h): which matrices each
// parameter holds, which rank orthogonalizes each, and which pieces of a shard are Muon's.
#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/fsdp/plan.h"
#include "runtime/optim/muon_layout.h"
#include "tests/test_support.h"

using namespace fsdp;

namespace {

// One block: a fused qkv (4 query heads and 2 key/value heads of 8: 64 rows), its output
// projection, a SwiGLU gate_up (2 x 96 rows) and its projection, a norm; and the root.
ShardingPlan block_plan(int dp_size) {
  std::vector<std::pair<std::string, std::vector<ParamSpec>>> units = {
      {"h.0",
       {{"h.0.attn.qkv.weight", Shape{64, 32}, true},
        {"h.0.attn.proj.weight", Shape{32, 32}, true},
        {"h.0.mlp.gate_up.weight", Shape{192, 32}, true},
        {"h.0.mlp.proj.weight", Shape{32, 96}, true},
        {"h.0.norm.weight", Shape{32}, false}}},
      {"root", {{"wte.weight", Shape{100, 32}, true}}}};
  PlanOptions o;
  o.dp_size = dp_size;
  o.block = 128;
  return ShardingPlan::build(units, o);
}

// The plan's units as Muon sees them, on shard rank `rank`.
std::vector<MuonUnitGeometry> geometry(const ShardingPlan& plan, int rank = 0) {
  std::vector<MuonUnitGeometry> out;
  for (const UnitPlan& u : plan.units()) {
    MuonUnitGeometry g;
    g.name = u.name;
    for (const ParamPlacement& p : u.params) g.params.push_back({p.name, p.shape, p.offset});
    g.padded_numel = u.padded_numel;
    g.shard_numel = u.shard_numel;
    g.shard_rank = rank;
    g.shard_size = u.dp_size;
    out.push_back(g);
  }
  return out;
}

std::vector<MuonParamSpec> block_specs() {
  return {{"h.0.attn.qkv.weight", {32, 16, 16}, false, nullptr},
          {"h.0.attn.proj.weight", {}, false, nullptr},
          {"h.0.mlp.gate_up.weight", {96, 96}, false, nullptr},
          {"h.0.mlp.proj.weight", {}, false, nullptr}};
}

}  // namespace

TEST_CASE("muon_units splits parameters into their matrices and balances the owners", "[optim][muon]") {
  const ShardingPlan plan = block_plan(4);
  const std::vector<MuonUnit> units = muon_units(geometry(plan), block_specs(), 5);
  REQUIRE(units.size() == 1);  // the root has no matrix
  const MuonUnit& mu = units[0];
  CHECK(mu.unit == 0);
  REQUIRE(mu.items.size() == 4);
  const MuonItem& qkv = mu.items[0];
  REQUIRE(qkv.matrices.size() == 3);
  CHECK(qkv.matrices[1].first == 32 * 32);  // k starts after q's 32 rows of 32
  CHECK(qkv.matrices[1].rows == 16);
  CHECK(qkv.matrices[2].cols == 32);
  CHECK(mu.items[2].matrices.size() == 2);  // gate and up
  CHECK(mu.items[2].matrices[1].first == 96 * 32);
  // Every item has its own owner over the 4 ranks (4 items): the largest first.
  std::vector<int> owners;
  for (const MuonItem& item : mu.items) owners.push_back(item.owner);
  std::sort(owners.begin(), owners.end());
  CHECK(owners == std::vector<int>{0, 1, 2, 3});
  CHECK(mu.items[2].owner == 0);  // gate_up has the most work
  // FLOPs of a (rows, cols) matrix: 5 steps of 4 m^2 n + 2 m^3, m the short side.
  CHECK(newton_schulz_flops(16, 32, 5) == 5.0 * (4 * 16 * 16 * 32 + 2 * 16 * 16 * 16));
  CHECK(newton_schulz_flops(32, 16, 5) == newton_schulz_flops(16, 32, 5));
}

TEST_CASE("muon shard pieces cover the Muon parameters' elements exactly once", "[optim][muon]") {
  for (int dp : {1, 2, 4}) {
    INFO(dp << " ranks");
    const ShardingPlan plan = block_plan(dp);
    const UnitPlan& unit = plan.units()[0];
    int64_t covered = 0;
    for (int r = 0; r < dp; ++r) {
      const std::vector<MuonUnit> units = muon_units(geometry(plan, r), block_specs(), 5);
      for (const ShardPiece& p : muon_shard_pieces(units[0])) {
        CHECK(p.shard_offset >= 0);
        CHECK(p.shard_offset + p.numel <= unit.shard_numel);
        covered += p.numel;
      }
    }
    CHECK(covered == 64 * 32 + 32 * 32 + 192 * 32 + 32 * 96);
  }
}

TEST_CASE("muon_units refuses specs that do not fit the plan", "[optim][muon]") {
  const ShardingPlan plan = block_plan(1);
  CHECK_THROWS_WITH(muon_units(geometry(plan), {{"h.9.attn.qkv.weight", {}, false, nullptr}}, 5),
                    Catch::Matchers::Contains("not in the sharded model"));
  CHECK_THROWS_WITH(muon_units(geometry(plan), {{"h.0.attn.qkv.weight", {32, 16}, false, nullptr}}, 5),
                    Catch::Matchers::Contains("do not split"));
  CHECK_THROWS_WITH(muon_units(geometry(plan), {{"h.0.attn.qkv.weight", {}, true, nullptr}}, 5),
                    Catch::Matchers::Contains("(experts, rows, cols) expected"));
}

TEST_CASE("muon's update scale follows PyTorch's adjust_lr_fn", "[optim][muon]") {
  CHECK(muon_scale(MuonScale::match_rms_adamw, 768, 3072) == Approx(0.2 * std::sqrt(3072.0)));
  CHECK(muon_scale(MuonScale::original, 3072, 768) == Approx(2.0));
  CHECK(muon_scale(MuonScale::original, 768, 3072) == 1.0);
}
