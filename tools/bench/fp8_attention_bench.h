// `bench fp8-attention`: a workload's attention in bf16 against cuDNN's FP8 graphs (GPU).
#pragma once

#include <string>
#include <vector>

namespace fsdp::bench {

int run_fp8_attention_bench(const std::vector<std::string>& args);

}  // namespace fsdp::bench
