// `bench train`: the speed and memory of a training workload (docs/PERFORMANCE.md's rows).
#pragma once

#include <string>
#include <vector>

namespace fsdp::bench {

int run_train_bench(const std::vector<std::string>& args);

}  // namespace fsdp::bench
