#include "runtime/data/assets.h"

#include <sys/stat.h>

#include <cstdlib>
#include <vector>

#include "runtime/core/error.h"

namespace fsdp::data {
namespace {

// The Bazel workspace name (WORKSPACE: workspace(name = "fsdp")): runfiles live under it.
constexpr const char* kWorkspaceName = "fsdp";

bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

}  // namespace

std::string locate_asset(const std::string& repo_path, const std::string& argv0) {
  FSDP_CHECK(!repo_path.empty(), DataError, "empty asset path");
  if (repo_path.front() == '/') {
    FSDP_CHECK(is_file(repo_path), DataError, "cannot open '", repo_path, "'");
    return repo_path;
  }
  std::vector<std::string> candidates = {repo_path};
  for (const char* var : {"BUILD_WORKING_DIRECTORY", "BUILD_WORKSPACE_DIRECTORY"}) {
    if (const std::string dir = env(var); !dir.empty()) candidates.push_back(dir + "/" + repo_path);
  }
  for (const char* var : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    if (const std::string dir = env(var); !dir.empty()) {
      candidates.push_back(dir + "/" + kWorkspaceName + "/" + repo_path);
    }
  }
  if (!argv0.empty()) {
    candidates.push_back(argv0 + ".runfiles/" + kWorkspaceName + "/" + repo_path);
  }

  std::string tried;
  for (const std::string& path : candidates) {
    if (is_file(path)) return path;
    tried += (tried.empty() ? "'" : ", '") + path + "'";
  }
  FSDP_THROW(DataError, "cannot find '", repo_path, "' (looked at ", tried,
             "); run from the repository root or pass the path explicitly");
}

}  // namespace fsdp::data
