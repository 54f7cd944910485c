// bench memory-bound: the kernels of a training step that move memory rather than compute
// (norms, residual adds, activations, bias gradients, FP8 casts, the optimizer), each at a
// workload's shapes, as GB/s against a device-to-device copy timed in the same run.
#pragma once

#include <string>
#include <vector>

namespace fsdp::bench {

int run_memory_bound_bench(const std::vector<std::string>& args);

}  // namespace fsdp::bench
