// A fresh, empty directory for one test's files, inside Bazel's per-test temporary
// directory (TEST_TMPDIR), or the system's temporary directory when run by hand.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace fsdp::testing {

inline std::string scratch_dir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  std::filesystem::path dir =
      (root ? std::filesystem::path(root) : std::filesystem::temp_directory_path()) /
      ("fsdp_train_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// A directory every rank of an MPI test names alike (a run's checkpoints), suffixed with the
// world size so that the test's np copies do not meet. Rank 0 clears it: call it before the
// run's first collective, so that the other ranks touch it only after that.
inline std::string shared_dir(const std::string& name, int world_rank, int world_size) {
  const char* root = std::getenv("TEST_TMPDIR");
  const std::filesystem::path dir =
      (root ? std::filesystem::path(root) : std::filesystem::temp_directory_path()) /
      ("fsdp_train_" + name + "_np" + std::to_string(world_size));
  if (world_rank == 0) std::filesystem::remove_all(dir);
  return dir.string();
}

}  // namespace fsdp::testing
