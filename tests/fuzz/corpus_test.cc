// Runs one fuzz target on every file of its corpus directory (FUZZ_CORPUS, relative to the
// runfiles root): the seeds, and every input a fuzzing run found to fail, kept there as a
// regression. This is how the targets run in the ordinary build and in CI's test count;
// scripts/fuzz.sh runs them under libFuzzer.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_target.h"
#include "tests/test_support.h"

TEST_CASE("every corpus input of " FUZZ_TARGET " is accepted or refused with our error", "[fuzz]") {
  std::vector<std::filesystem::path> inputs;
  for (const auto& e : std::filesystem::directory_iterator(FUZZ_CORPUS))
    if (e.is_regular_file()) inputs.push_back(e.path());
  std::sort(inputs.begin(), inputs.end());
  REQUIRE(inputs.size() >= 3);  // a seed corpus worth the name
  for (const auto& path : inputs) {
    INFO(path.string());
    std::ifstream in(path, std::ios::binary);
    REQUIRE(in.good());
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()) == 0);
  }
}
