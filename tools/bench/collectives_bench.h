// `bench collectives`: an nccl-tests-style bus-bandwidth table for all-gather,
// reduce-scatter and all-reduce, measured through our Communicator ("ours") and through
// the backend's own calls on the same communicator and stream ("raw": NCCL on GPUs, MPI on
// CPUs), with the ratio between them.
//
//   mpirun -np 2 bench collectives [--ops ag,rs,ar] [--min-bytes 1M] [--max-bytes 1G]
//       [--step-factor 2] [--dtype bf16] [--iters 20] [--warmup 5] [--rounds 3]
//       [--backend auto|nccl|mpi] [--timeout-s 600] [--check] [--register none|local|symmetric]
//
// size is the largest buffer of the operation (the all-gather's output, the
// reduce-scatter's input, the all-reduce's buffer), as in nccl-tests; algbw = size / time;
// busbw = algbw x (n-1)/n for all-gather and reduce-scatter, x 2(n-1)/n for all-reduce.
// Times are the median of --rounds alternating rounds of --iters back-to-back operations
// (CUDA events on GPUs). --check also verifies each size's result once before timing.
// --register local|symmetric allocates the send and receive buffers with ncclMemAlloc and
// registers them with the communicator (ncclCommRegister / ncclCommWindowRegister): both
// "ours" and "raw" then run on registered buffers (a no-op on MPI).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/world.h"
#include "runtime/core/dtype.h"

namespace fsdp::bench {

struct CollectivesBenchOptions {
  std::vector<CollectiveKind> ops = {CollectiveKind::all_gather, CollectiveKind::reduce_scatter,
                                     CollectiveKind::all_reduce};
  // 0 / -1: the backend's defaults (GPU: 1 MiB .. 1 GiB, 20 iterations after 5, 3 rounds;
  // CPU: 4 KiB .. 256 KiB, 5 iterations after 1, 1 round).
  size_t min_bytes = 0;
  size_t max_bytes = 0;
  int step_factor = 2;
  DType dtype = DType::bf16;
  int iters = 0;
  int warmup = -1;
  int rounds = 0;
  Backend backend = Backend::Auto;
  double timeout_s = 600;
  bool check = false;
  std::optional<BufferRegistration> registration;  // --register; nullopt: none
  bool help = false;
};

// Throws ConfigError naming the flag for anything it cannot use.
CollectivesBenchOptions parse_collectives_bench_args(const std::vector<std::string>& args);
const char* collectives_bench_usage();
// "1 MiB" style sizes: 4096, 64K, 1M, 1MiB, 2G.
size_t parse_byte_size(const std::string& flag, const std::string& text);

// Runs the benchmark in this process's World; rank 0 prints the table. Returns 0.
int run_collectives_bench(const std::vector<std::string>& args);

}  // namespace fsdp::bench
