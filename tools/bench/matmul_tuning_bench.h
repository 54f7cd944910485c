// bench matmul-tuning: a workload's training matmuls with cuBLASLt's heuristic choice and
// with the timed choice (kernels/cuda/matmul.h: MatmulTuning), forward, dgrad and wgrad.
#pragma once

#include <string>
#include <vector>

namespace fsdp::bench {

int run_matmul_tuning_bench(const std::vector<std::string>& args);

}  // namespace fsdp::bench
