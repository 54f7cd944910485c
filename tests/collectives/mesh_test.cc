// Mesh math: sizes, -1, rank <-> coordinates, groups, and errors for impossible shapes.
#include <set>
#include <string>
#include <vector>

#include "collectives/mesh.h"
#include "runtime/core/error.h"
#include "tests/test_support.h"

namespace fsdp {
namespace {

using Catch::Matchers::Contains;

// Sizes in axis order: dp_outer, dp_shard, cp, ep, tp.
MeshSizes sizes(int dp_outer, int dp_shard, int cp, int ep, int tp) {
  return {dp_outer, dp_shard, cp, ep, tp};
}

std::string mesh_error(const MeshSizes& s, int world) {
  try {
    Mesh m(s, world);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("-1 fills what the other axes leave") {
  const Mesh m(sizes(2, -1, 1, 1, 2), 16);
  CHECK(m.size(MeshAxis::dp_shard) == 4);
  CHECK(m.dp_size() == 8);
  CHECK(m.str() == "dp_outer=2 x dp_shard=4 x cp=1 x ep=1 x tp=2");
  CHECK(Mesh(sizes(1, 1, 1, 1, -1), 8).size(MeshAxis::tp) == 8);
  CHECK(Mesh(sizes(1, 1, 1, 1, 1), 1).dp_size() == 1);
}

TEST_CASE("tp varies fastest, dp_outer slowest") {
  const Mesh m(sizes(2, 2, 1, 1, 2), 8);
  CHECK(m.coords(0) == MeshCoords{0, 0, 0, 0, 0});
  CHECK(m.coords(1) == MeshCoords{0, 0, 0, 0, 1});
  CHECK(m.coords(2) == MeshCoords{0, 1, 0, 0, 0});
  CHECK(m.coords(5) == MeshCoords{1, 0, 0, 0, 1});
  CHECK(m.coords(7) == MeshCoords{1, 1, 0, 0, 1});
  for (int r = 0; r < 8; ++r) CHECK(m.rank_of(m.coords(r)) == r);
  const Mesh all(sizes(2, 3, 2, 1, 2), 24);
  std::set<MeshCoords> seen;
  for (int r = 0; r < 24; ++r) {
    CHECK(all.rank_of(all.coords(r)) == r);
    seen.insert(all.coords(r));
  }
  CHECK(seen.size() == 24);
}

TEST_CASE("groups: per axis, and the flattened dp group") {
  const Mesh m(sizes(2, 2, 1, 1, 2), 8);
  CHECK(m.axis_group(MeshAxis::tp, 5) == std::vector<int>{4, 5});
  CHECK(m.axis_group(MeshAxis::dp_shard, 5) == std::vector<int>{5, 7});
  CHECK(m.axis_group(MeshAxis::dp_outer, 5) == std::vector<int>{1, 5});
  CHECK(m.axis_group(MeshAxis::cp, 5) == std::vector<int>{5});
  CHECK(m.dp_group(5) == std::vector<int>{1, 3, 5, 7});
  CHECK(m.dp_group(0) == std::vector<int>{0, 2, 4, 6});
  // Expert-parallel ranks take different data: they are in the data-parallel group.
  const Mesh ep(sizes(1, 2, 1, 2, 1), 4);
  CHECK(ep.dp_size() == 4);
  CHECK(ep.dp_group(1) == std::vector<int>{0, 1, 2, 3});
  CHECK(ep.axis_group(MeshAxis::ep, 2) == std::vector<int>{2, 3});
  // Every rank is in exactly one group of each kind, and the groups agree with each other.
  for (int r = 0; r < 8; ++r) {
    for (int other : m.dp_group(r)) CHECK(m.dp_group(other) == m.dp_group(r));
    for (int other : m.axis_group(MeshAxis::tp, r)) {
      CHECK(m.axis_group(MeshAxis::tp, other) == m.axis_group(MeshAxis::tp, r));
    }
  }
}

TEST_CASE("impossible meshes are ConfigErrors naming the axes and the world size") {
  CHECK_THAT(mesh_error(sizes(1, 3, 1, 1, 1), 4), Contains("dp_shard=3") && Contains("4"));
  CHECK_THAT(mesh_error(sizes(1, -1, 1, 1, -1), 4), Contains("dp_shard") && Contains("tp"));
  CHECK_THAT(mesh_error(sizes(1, -1, 1, 1, 3), 4),
             Contains("dp_shard=-1") && Contains("world of 4"));
  CHECK_THAT(mesh_error(sizes(1, 0, 1, 1, 1), 4), Contains("dp_shard=0"));
  CHECK_THAT(mesh_error(sizes(1, -2, 1, 1, 1), 4), Contains("dp_shard=-2"));
  CHECK_THAT(mesh_error(sizes(1, 1, 1, 1, 1), 0), Contains("world size 0"));
  const Mesh m(sizes(1, 2, 1, 1, 1), 2);
  CHECK_THROWS_AS(m.coords(2), IndexError);
  CHECK_THROWS_AS(m.rank_of(MeshCoords{0, 2, 0, 0, 0}), IndexError);
}

}  // namespace
}  // namespace fsdp
