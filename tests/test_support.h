// Helpers every fsdp.cpp test may use, beside Catch2 itself.
#pragma once

#include <string>

#include <catch2/catch.hpp>

namespace fsdp::testing {

// Marks the running test case as skipped, with a reason printed in the test log and
// counted as "skipped" (not passed) in the summary.
void mark_skipped(const std::string& reason);

// True when a CUDA device is usable by this process.
bool gpu_available();

// The backend the [gpu] multi-rank cases use: FSDP_TEST_GPU_BACKEND ("nccl" when unset;
// scripts/gpu_run.sh sets "staged" where there are more ranks than GPUs).
const char* gpu_backend_name();

// Rank and size of MPI_COMM_WORLD in MPI test binaries (0 and 1 elsewhere).
int world_rank();
int world_size();

}  // namespace fsdp::testing

// First statement of a [gpu] test: skips it (visibly) where no GPU is present.
#define FSDP_REQUIRE_GPU()                                                   \
  do {                                                                       \
    if (!::fsdp::testing::gpu_available()) {                                 \
      ::fsdp::testing::mark_skipped("no CUDA device (or CPU-only build)");   \
      return;                                                                \
    }                                                                        \
  } while (0)
