// What every fuzz target shares. A target defines LLVMFuzzerTestOneInput, which libFuzzer
// calls with generated inputs (scripts/fuzz.sh, --config=fuzz) and corpus_test.cc calls with
// every file of the target's corpus (tests/fuzz/corpus/<target>/) in the ordinary build.
//
// A target returns normally when the code under test accepted the input or refused it with
// one of our errors (fsdp::Error and its kinds: the clear message the input deserves); any
// other exception escaping, a crash, a sanitizer report, a hang or a broken property is a
// finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace fsdp::fuzz {

// The input as bytes.
inline std::string_view bytes_of(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

// The input cut at each NUL byte (a target that takes several strings reads them this way).
std::vector<std::string> split_at_nul(std::string_view input);

// A file of this process's own in the temporary directory, rewritten for each input of a
// reader that takes a path. Removed when the process ends normally.
class ScratchFile {
 public:
  explicit ScratchFile(const std::string& suffix);
  ~ScratchFile();
  // Replaces the file's contents with `bytes` and returns its path.
  const std::string& write(std::string_view bytes);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Stops the target with a message naming the broken property (libFuzzer saves the input).
[[noreturn]] void property_failed(const char* what);

}  // namespace fsdp::fuzz
