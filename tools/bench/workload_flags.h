// The flags the per-workload kernel benchmarks share (fp8-matmul, matmul-tuning,
// memory-bound): --workload NAME | --config FILE, --reps R, --help.
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "tools/bench/linear_shapes.h"
#include "tools/common/numeric_flags.h"

namespace fsdp::bench {

struct WorkloadFlags {
  std::string config;  // the recipe file
  int reps = 20;
  bool help = false;   // --help was given (usage printed to stdout)
};

// Parses `args`; `own(flag, value)` takes a flag of the benchmark's own and returns whether
// it did (`value()` consumes the flag's value). Unknown flags print the usage to stderr and
// throw ConfigError, as does a missing workload.
inline WorkloadFlags parse_workload_flags(
    const std::vector<std::string>& args, void (*usage)(std::FILE*),
    const std::function<bool(const std::string&, const std::function<std::string()>&)>& own = {}) {
  WorkloadFlags f;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const std::function<std::string()> value = [&]() -> std::string {
      FSDP_CHECK(i + 1 < args.size(), ConfigError, a, " needs a value");
      return args[++i];
    };
    if (a == "--help" || a == "-h") {
      usage(stdout);
      f.help = true;
      return f;
    } else if (a == "--workload") {
      const std::string name = value();
      auto it = matmul_bench_workloads().find(name);
      FSDP_CHECK(it != matmul_bench_workloads().end(), ConfigError, "unknown workload '", name,
                 "' (see --help)");
      f.config = it->second;
    } else if (a == "--config") {
      f.config = value();
    } else if (a == "--reps") {
      f.reps = tools::integer_flag<int>(a, value(), 1, 1000000);
    } else if (!own || !own(a, value)) {
      usage(stderr);
      FSDP_THROW(ConfigError, "unknown flag ", a);
    }
  }
  FSDP_CHECK(!f.config.empty() && f.reps > 0, ConfigError,
             "give --workload or --config, and --reps > 0");
  return f;
}

}  // namespace fsdp::bench
