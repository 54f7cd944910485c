// bench grouped-matmul: the experts' grouped matmul on a GPU beside one dense matmul of the
// same total size (tools/bench/main.cc dispatches here).
#pragma once

#include <string>
#include <vector>

namespace fsdp::bench {

int run_grouped_matmul_bench(const std::vector<std::string>& args);

}  // namespace fsdp::bench
