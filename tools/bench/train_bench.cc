#include "tools/bench/train_bench.h"

#include <mpi.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/train/metrics_line.h"
#include "runtime/train/recipe.h"
#include "runtime/train/trainer.h"
#include "tools/common/exit_after_failure.h"
#include "tools/common/numeric_flags.h"

namespace fsdp::bench {
namespace {

// Named workloads: the rows of docs/PERFORMANCE.md. Each is a recipe plus overrides; the data
// is the embedded text (the token values do not change the speed).
struct Workload {
  const char* config;
  std::vector<std::string> overrides;
};

const std::map<std::string, Workload>& workloads() {
  static const std::map<std::string, Workload> w = {
      {"gpt2-124m", {"configs/gpt2-124m.json", {}}},
      {"gpt-1.3b", {"configs/gpt-1.3b.json", {}}},
      {"llama-1b", {"configs/llama-1b.json", {}}},
  };
  return w;
}

const std::vector<std::string> kBenchOverrides = {
    "dataset.type=text",
    "dataset.train_path=third_party/text/austen.txt",
    "dataset.val_path=null",
    "dataset.val_fraction=0",
    "train.eval_interval=0",
    // The learning rate does not change the speed; a schedule that fits any step count.
    "scheduler.lr_warmup_iters=0",
    "scheduler.lr_decay_iters=0",
    "checkpoint.save=null",
    "checkpoint.load=null",
    "logger.metrics_file=null",
};

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: bench train (--workload NAME | --config FILE) [--steps N] [--warmup N]\n"
               "                   [--compute-baseline] [--profile] [--verbose] [KEY=VALUE ...]\n"
               "  Trains N timed steps after the warm-up and prints tokens/s (total and per GPU),\n"
               "  TFLOP/s and MFU, peak memory (allocated and reserved), the step time and its\n"
               "  split into compute, exposed communication and optimizer. With\n"
               "  --compute-baseline the run is repeated with every collective replaced by a\n"
               "  local copy; exposed communication = step time - that run's step time. With\n"
               "  --profile the profiler's capture window (cudaProfilerStart/Stop) spans the\n"
               "  timed steps only, for `ncu --profile-from-start off`. --verbose prints the\n"
               "  trainer's set-up (memory prediction) and step lines as training does.\n"
               "  Workloads:");
  for (const auto& [name, w] : workloads()) std::fprintf(out, " %s", name.c_str());
  std::fprintf(out, "\n");
}

}  // namespace

int run_train_bench(const std::vector<std::string>& args) {
  std::string config;
  std::vector<std::string> overrides;
  int64_t steps = 10, warmup = 2;
  bool baseline = false, profile = false, verbose = false;
  std::string name = "custom";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      FSDP_CHECK(i + 1 < args.size(), ConfigError, a, " needs a value");
      return args[++i];
    };
    if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    } else if (a == "--workload") {
      name = value();
      auto it = workloads().find(name);
      FSDP_CHECK(it != workloads().end(), ConfigError, "unknown workload '", name, "' (see --help)");
      config = it->second.config;
      overrides.insert(overrides.end(), it->second.overrides.begin(), it->second.overrides.end());
    } else if (a == "--config") {
      config = value();
    } else if (a == "--steps") {
      steps = tools::integer_flag<int64_t>(a, value(), 1, 1000000);
    } else if (a == "--warmup") {
      warmup = tools::integer_flag<int64_t>(a, value(), 0, 1000000);
    } else if (a == "--profile") {
      profile = true;
    } else if (a == "--verbose") {
      verbose = true;
    } else if (a == "--compute-baseline") {
      baseline = true;
    } else {
      FSDP_CHECK(a.find('=') != std::string::npos, ConfigError, "unknown argument '", a, "'");
      overrides.push_back(a);
    }
  }
  if (config.empty()) {
    usage(stderr);
    return 2;
  }
  std::vector<std::string> all = kBenchOverrides;
  all.insert(all.end(), overrides.begin(), overrides.end());
  all.push_back(str_cat("train.train_iters=", steps + warmup));
  const train::Recipe recipe = train::load_recipe(config, all);

  // MPI stays initialized across the two runs (each Trainer's World reuses it).
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  auto run = [&](bool skip) {
    train::TrainerOptions o;
    o.out = verbose && !skip ? stdout : nullptr;
    o.print_sample = false;
    o.warmup_steps = warmup;
    o.skip_collectives = skip;
    o.on_comm_failure = tools::exit_after_failure();
    o.time_collectives = !skip && !profile;
    o.profile_timed_steps = profile && !skip;
    train::Trainer trainer(recipe, o);
    return trainer.run();
  };
  const train::TrainResult r = run(false);
  train::TrainResult base;
  if (baseline) base = run(true);

  if (rank == 0) {
    const double step_ms = r.step_time_s * 1e3, opt_ms = r.optimizer_time_s * 1e3;
    // ddp.nccl_ub (a KEY=VALUE override like any other) applies on CUDA only.
    const bool ub = recipe.ddp.nccl_ub && recipe.dist.device != "cpu";
    std::printf("# bench train: %s (%s), %d rank(s), %s%s, %lld timed steps after %lld warm-up\n",
                name.c_str(), config.c_str(), size,
                recipe.ddp.data_parallel_sharding_strategy.c_str(),
                ub ? str_cat(", nccl_ub (", recipe.ddp.nccl_ub_registration, ")").c_str() : "",
                (long long)steps, (long long)warmup);
    std::printf("tokens/s total     %s\n", train::format_count(r.tokens_per_sec).c_str());
    std::printf("tokens/s per GPU   %s\n", train::format_count(r.tokens_per_sec / size).c_str());
    std::printf("TFLOP/s per GPU    %.1f\n", r.tflops_per_device);
    std::printf("MFU                %.1f%%\n", 100 * r.mfu);
    if (!r.fp8.layers.empty() || !r.fp8.bf16_blocks.empty()) {
      std::string bf16;
      for (const std::string& b : r.fp8.bf16_blocks) bf16 += (bf16.empty() ? "blocks " : ", ") + b;
      for (const std::string& l : r.fp8.bf16_layers) bf16 += (bf16.empty() ? "" : ", ") + l;
      std::printf("fp8 layers         %zu linear layers of the blocks%s%s%s\n",
                  r.fp8.layers.size() - (r.fp8.classifier.empty() ? 0 : 1),
                  r.fp8.classifier.empty() ? "" : (" and the classifier " + r.fp8.classifier).c_str(),
                  bf16.empty() ? "" : "; in bf16: ", bf16.c_str());
    }
    std::printf("peak allocated     %s\n", train::format_bytes(r.peak_allocated_bytes).c_str());
    std::printf("peak reserved      %s\n", train::format_bytes(r.peak_reserved_bytes).c_str());
    if (r.device_bytes_outside_allocator != 0)  // GPU runs
      std::printf("outside allocator  %s (the GPU's memory in use at the end that the "
                  "allocator does not hold: CUDA context, libraries, communicators)\n",
                  train::format_bytes(r.device_bytes_outside_allocator).c_str());
    if (ub) {
      std::printf("  (nccl_ub: the registered collective buffers come from ncclMemAlloc, outside "
                  "these figures; --verbose prints them)\n");
    }
    std::printf("step time          %.1f ms\n", step_ms);
    std::printf("  optimizer        %.1f ms\n", opt_ms);
    std::printf("  host issue       %.1f ms (the host's time to queue the step's work)\n",
                r.issue_time_s * 1e3);
    std::printf("  forward+backward %.1f ms on the device, queued by the host in %.1f ms\n",
                r.forward_backward_s * 1e3, r.queue_time_s * 1e3);
    std::printf("  allocations      %.0f per step, %.1f of them new memory from the system\n",
                r.allocs_per_step, r.system_allocs_per_step);
    if (recipe.train.cuda_graphs)
      std::printf("  cuda graphs      %lld micro-batches replayed in the run (warm-up included)\n",
                  (long long)r.cuda_graph_replays);
    // Device time of this rank's collectives per step, from the moment each one's stream
    // reached it until it ended (waiting for the peers included), and the bus bandwidth
    // that time implies ((n-1)/n of the buffer for gathers and scatters, 2(n-1)/n for
    // all-reduces).
    auto collectives = [&](const char* what, const train::TrainResult::Collective& c,
                           double factor) {
      if (c.count == 0) return;
      const double bus = c.ms > 0 ? c.bytes * factor / (c.ms * 1e-3) / 1e9 : 0;
      std::printf("  %-16s %.0f per step, %.0f MB, %.1f ms on the device (%.0f GB/s bus)\n",
                  what, c.count, c.bytes / 1e6, c.ms, bus);
    };
    const double n = size;
    collectives("all-gathers", r.all_gathers, (n - 1) / n);
    collectives("reduce-scatters", r.reduce_scatters, (n - 1) / n);
    collectives("all-reduces", r.all_reduces, 2 * (n - 1) / n);
    if (baseline) {
      const double compute_ms = base.step_time_s * 1e3 - base.optimizer_time_s * 1e3;
      const double exposed_ms = std::max(0.0, step_ms - base.step_time_s * 1e3);
      std::printf("  compute          %.1f ms\n", compute_ms);
      std::printf("  exposed comm     %.1f ms (%.1f%% of the step)\n", exposed_ms,
                  100 * exposed_ms / step_ms);
    }
  }
  if (!initialized) MPI_Finalize();
  return 0;
}

}  // namespace fsdp::bench
