// bench: benchmarks of fsdp.cpp's parts, one subcommand each.
//
//   bench collectives [flags]   bus bandwidth of our collectives against raw NCCL / MPI
//   bench fp8-matmul [flags]    a workload's linear layers in bf16 against FP8 (GPU)
//   bench grouped-matmul [flags] the experts' grouped matmul beside a dense one (GPU)
//   bench matmul [flags]        the CPU matmul on one shape, OpenBLAS against our kernel
//   bench matmul-tuning [flags] a workload's matmuls: the heuristic's algorithm vs the timed one
//   bench memory-bound [flags]  a workload's memory-bound kernels in GB/s against a copy (GPU)
//   bench train [flags]         tokens/s, MFU, memory and step-time split of a workload
//
// This file only dispatches; each subcommand lives in its own file.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "tools/bench/collectives_bench.h"
#include "tools/bench/fp8_matmul_bench.h"
#include "tools/bench/grouped_matmul_bench.h"
#include "tools/bench/matmul_bench.h"
#include "tools/bench/matmul_tuning_bench.h"
#include "tools/bench/memory_bound_bench.h"
#include "tools/bench/train_bench.h"

namespace {

struct Subcommand {
  const char* name;
  int (*run)(const std::vector<std::string>& args);
  const char* summary;
};

const Subcommand kSubcommands[] = {
    {"collectives", fsdp::bench::run_collectives_bench,
     "all-gather / reduce-scatter / all-reduce bus bandwidth, ours vs raw"},
    {"fp8-matmul", fsdp::bench::run_fp8_matmul_bench,
     "a workload's linear layers, forward / dgrad / wgrad, bf16 against FP8 (GPU)"},
    {"grouped-matmul", fsdp::bench::run_grouped_matmul_bench,
     "the experts' grouped matmul on a GPU beside one dense matmul of the same size"},
    {"matmul", fsdp::bench::run_matmul_bench,
     "the CPU matmul on one shape: OpenBLAS against the hand-written kernel"},
    {"matmul-tuning", fsdp::bench::run_matmul_tuning_bench,
     "a workload's training matmuls: cuBLASLt's heuristic choice against the timed one (GPU)"},
    {"memory-bound", fsdp::bench::run_memory_bound_bench,
     "a workload's memory-bound kernels (norms, adds, activations, casts, AdamW) in GB/s (GPU)"},
    {"train", fsdp::bench::run_train_bench,
     "tokens/s, MFU, peak memory and the compute / communication / optimizer split"},
};

void usage(std::FILE* out) {
  std::fprintf(out, "usage: bench <subcommand> [flags]   (bench <subcommand> --help)\n");
  for (const Subcommand& s : kSubcommands) std::fprintf(out, "  %-14s %s\n", s.name, s.summary);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const Subcommand& s : kSubcommands) {
    if (s.name != std::string(argv[1])) continue;
    try {
      return s.run(std::vector<std::string>(argv + 2, argv + argc));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench %s: %s\n", s.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "bench: unknown subcommand '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
