// A two-rank job in which rank 1 dies (abort) while rank 0 waits in a collective. Run under
// mpirun by dead_rank_test.sh, which requires the job to end non-zero, quickly, naming the
// dead rank: a dead rank must end every rank, never leave one hanging.
//   dead_rank_probe [mpi|staged]   (the backend; mpi by default)
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

#include "collectives/world.h"

int main(int argc, char** argv) {
  using namespace fsdp;
  try {
    WorldOptions options;
    options.backend = argc > 1 ? backend_from_name(argv[1], "the backend") : Backend::Mpi;
    options.timeout = std::chrono::seconds(20);
    World world(options);
    if (world.rank() == 1) std::abort();  // dies without a word, like a crashed process
    std::vector<float> buf(16, 1.0f);
    world.comm().all_reduce(buf.data(), buf.data(), 16, DType::f32, ReduceOp::Sum, Stream());
    std::printf("rank %d: the collective finished without the dead rank\n", world.rank());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
