// The coverage of the CPU-vs-CUDA twin harness. The twin cases themselves are registered by
// tests/kernels/twins/*_twins.cc, each as a [gpu] test case comparing both sides and a
// reference test case running the CPU side alone (see tests/kernels/twin_harness.h).
#include <algorithm>
#include <set>
#include <string>

#include "tests/kernels/twin_harness.h"
#include "tests/test_support.h"

using namespace fsdp::testing;

namespace {

// One family per kernel header under kernels/cuda/, named as the header. Not listed:
// cudnn_graph.h (the cuDNN graph builder cudnn_attention runs on, no kernel of its own) and
// library_check.h (status checks).
const char* const kKernelFamilies[] = {
    "activation",  "adamw",  "attention",  "attention_gemm", "basic",  "block_reduce",
    "column_sum",  "cross_entropy", "cudnn_attention", "embedding", "fp8",
    "fp8_blocks", "fp8_rows", "init", "matmul", "moe",
    "newton_schulz", "norm",
};

}  // namespace

TEST_CASE("every CUDA kernel family has CPU-vs-CUDA twin cases", "[kernels][twin]") {
  const std::vector<TwinCase>& cases = twin_cases();
  for (const char* family : kKernelFamilies) {
    const auto n = std::count_if(cases.begin(), cases.end(),
                                 [&](const TwinCase& c) { return c.family == family; });
    INFO("family " << family);
    CHECK(n > 0);
  }
  // Every case belongs to a listed family, and no two cases share a name.
  const std::set<std::string> families(std::begin(kKernelFamilies), std::end(kKernelFamilies));
  std::set<std::string> names;
  for (const TwinCase& c : cases) {
    INFO("case " << c.family << ": " << c.name);
    CHECK(families.count(c.family) == 1);
    CHECK(names.insert(c.family + ": " + c.name).second);
  }
}
