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

}  // namespace fsdp::testing
