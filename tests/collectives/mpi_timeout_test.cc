// A collective that one rank does not take part in ends, on the others, with a TimeoutError
// naming the operation, the group, the step and the rank that never reached it, within the
// configured timeout; and every rank then finishes cleanly. Compiled a second time with
// FSDP_TEST_STAGED=1 (staged_timeout_test) for the staged backend, whose worker thread meets
// the timeout.
#include <mpi.h>

#include <chrono>
#include <string>
#include <vector>

#include "collectives/world.h"
#include "runtime/core/error.h"
#include "tests/test_support.h"

namespace fsdp {
namespace {

using Catch::Matchers::Contains;
using namespace std::chrono_literals;

TEST_CASE("a rank that skips a collective makes the others time out") {
  if (testing::world_size() < 2) {
    testing::mark_skipped("needs at least 2 ranks");
    return;
  }
  WorldOptions options;
#if FSDP_TEST_STAGED
  options.backend = Backend::Staged;
#else
  options.backend = Backend::Mpi;
#endif
  options.print_summary = false;
  options.timeout = 2s;
  // The failure listener (tools end a stuck process from it) hears the first failure once.
  std::vector<std::string> heard;
  options.on_failure = [&heard](const std::string& m) { heard.push_back(m); };
  World world(options);
  auto comm = world.split("dp_shard/rs", 0, world.rank());
  world.set_step(7);
  const int n = world.size();
  std::vector<float> send(64, 1.0f), recv(64, -1.0f);

  if (world.rank() != 0) {
    const auto start = std::chrono::steady_clock::now();
    std::string message;
    try {
      comm->all_reduce(send.data(), recv.data(), 64, DType::f32, ReduceOp::Sum, Stream());
      FAIL("the collective finished without rank 0");
    } catch (const TimeoutError& e) {
      message = e.what();
    }
    const auto elapsed = std::chrono::steady_clock::now() - start;
    CHECK(elapsed >= 2s);
    CHECK(elapsed < 3500ms);
    CHECK_THAT(message, Contains("all_reduce of 64 x f32") && Contains("group 'dp_shard/rs'") &&
                            Contains("step 7") && Contains("did not finish within 2 s") &&
                            Contains("rank 0 has not reached it (it started 0 operations on "
                                     "this group; this is operation 1)"));
    // The failure sticks: later calls on any communicator of the World raise it.
    CHECK_THROWS_AS(comm->barrier(), TimeoutError);
    CHECK_THROWS_AS(world.comm().barrier(), TimeoutError);
    CHECK_THROWS_AS(world.check_health(), TimeoutError);
    REQUIRE(heard.size() == 1);
    CHECK(heard.front() == message);
  }
  if (world.rank() == 0) CHECK(heard.empty());
  MPI_Barrier(MPI_COMM_WORLD);
  if (world.rank() == 0) {
    // Rank 0 takes part late, so the abandoned requests of the others complete and every
    // rank can end the test cleanly (the others progress it inside the next barrier). The
    // data they sent back then is still exact.
    CHECK_NOTHROW(world.check_health());
    comm->all_reduce(send.data(), recv.data(), 64, DType::f32, ReduceOp::Sum, Stream());
    for (float v : recv) REQUIRE(v == float(n));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace fsdp
