// `bench fp8-matmul`: a workload's linear layers in bf16 against FP8 (GPU).
#pragma once

#include <string>
#include <vector>

namespace fsdp::bench {

int run_fp8_matmul_bench(const std::vector<std::string>& args);

}  // namespace fsdp::bench
