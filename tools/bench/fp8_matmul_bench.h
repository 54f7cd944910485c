// bench fp8-matmul: cuBLASLt's FP8 matmuls against bf16 on a linear layer's three products.
#pragma once

#include <string>
#include <vector>

namespace fsdp::bench {

int run_fp8_matmul_bench(const std::vector<std::string>& args);

}  // namespace fsdp::bench
