// `bench matmul`: the CPU matmul's speed on one shape, OpenBLAS against the hand-written kernel.
#pragma once

#include <string>
#include <vector>

namespace fsdp::bench {

int run_matmul_bench(const std::vector<std::string>& args);

}  // namespace fsdp::bench
