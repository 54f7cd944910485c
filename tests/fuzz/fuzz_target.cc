#include "tests/fuzz/fuzz_target.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <unistd.h>

namespace fsdp::fuzz {

std::vector<std::string> split_at_nul(std::string_view input) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const size_t nul = input.find('\0', start);
    parts.emplace_back(input.substr(start, nul == std::string_view::npos ? nul : nul - start));
    if (nul == std::string_view::npos) return parts;
    start = nul + 1;
  }
}

ScratchFile::ScratchFile(const std::string& suffix) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  if (!tmp) tmp = std::getenv("TMPDIR");
  const std::string dir = tmp ? tmp : "/tmp";
  path_ = dir + "/fsdp_fuzz_" + std::to_string(getpid()) + suffix;
}

ScratchFile::~ScratchFile() {
  std::error_code ignored;
  std::filesystem::remove(path_, ignored);
}

const std::string& ScratchFile::write(std::string_view bytes) {
  std::ofstream out(path_, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path_.c_str());
    std::abort();
  }
  return path_;
}

void property_failed(const char* what) {
  std::fprintf(stderr, "fuzz: property broken: %s\n", what);
  std::abort();
}

}  // namespace fsdp::fuzz
