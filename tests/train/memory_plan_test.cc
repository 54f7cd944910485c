// The memory plan against the memory a run uses: on a CPU rank, whose allocator holds the
// same tensors a GPU's does, the dry run's predicted peak and the peak a short run measures.
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/train/dry_run.h"
#include "runtime/train/recipe.h"
#include "runtime/train/trainer.h"
#include "tests/test_support.h"
#include "tests/train/short_run.h"

namespace fsdp::train {
namespace {

using testing::short_run;
using testing::with;

// The size written after `label` in a dry run's report ("predicted peak    203 MiB") -> bytes.
double bytes_after(const std::string& report, const std::string& label) {
  const size_t at = report.find(label);
  REQUIRE(at != std::string::npos);
  std::istringstream line(report.substr(at + label.size()));
  double value = 0;
  std::string unit;
  line >> value >> unit;
  const double scale = unit == "B" ? 1 : unit == "KiB" ? 1024.0 : unit == "MiB" ? 1048576.0
                     : unit == "GiB" ? 1073741824.0 : 0;
  REQUIRE(scale > 0);
  return value * scale;
}

double predicted_peak_bytes(const std::string& report) {
  return bytes_after(report, "predicted peak");
}

// The page-locked host memory of CPU offload: "host memory per rank (cpu offload,
// page-locked): main weights ..., total 14.0 MiB"; 0 without offload.
double predicted_host_bytes(const std::string& report) {
  const size_t at = report.find("page-locked");
  if (at == std::string::npos) return 0;
  return bytes_after(report.substr(at), "total");
}

// Two steps of tiny shapes whose activations are most of the memory (so that a tensor the
// plan misses shows).
std::vector<std::string> tiny_run() {
  return with(short_run("memory_plan", "memory_plan", 2),
              {"scheduler.lr_warmup_iters=1", "model.n_layer=4", "model.d_model=128",
               "model.n_head=4", "model.d_ff=384", "model.seq_length=512",
               "train.micro_batch_size=4", "train.global_batch_size=4"});
}

// The Llama's settings: the 8B's as far as a CPU rank has them (ZeRO-3, bf16 moments; f32
// master weights and compute where a GPU computes in bf16).
const std::vector<std::string> kLlamaSettings = {
    "ddp.data_parallel_sharding_strategy=optim_grads_params",
    "mixed_precision.compute_dtype=f32", "mixed_precision.main_params_dtype=f32",
    "mixed_precision.grad_reduce_dtype=f32", "optimizer.moments_dtype=bf16"};

// The GPU's table is held to 3% (scripts/memory_table.sh). A CPU rank, whose allocations are
// the same in every run, is held to 1% (every row within 0.7% today), so that a tensor the
// plan misses shows here first.
constexpr double kBar = 0.01;

TEST_CASE("the dry run's predicted peak is the peak a run measures, within 1%",
          "[train][memory]") {
  // On a CPU rank, whose allocator holds the same tensors a GPU's does: tiny shapes whose
  // activations are most of the memory (so that a tensor the plan misses shows), for both
  // families and every recompute mode. GPT-2 runs as its golden recipe does (f64,
  // no_shard); the Llama with the 8B's settings as far as a CPU rank has them: ZeRO-3, f32
  // master weights and compute (bf16 on a GPU), bf16 moments.
  for (const char* family : {"llama", "gpt2"}) {
    for (const char* mode : {"none", "selective", "full", "full3"}) {
      const bool some = mode == std::string("full3");  // the first 3 of the 4 blocks
      std::vector<std::string> overrides = with(
          tiny_run(), {std::string("model.activation_recompute=") + (some ? "full" : mode)});
      if (some) overrides.push_back("model.recompute_num_layers=3");
      if (family == std::string("llama")) overrides = with(overrides, kLlamaSettings);
      const Recipe recipe =
          load_recipe(str_cat("tests/train/golden/", family, "_tiny.json"), overrides);
      const double predicted = predicted_peak_bytes(dry_run_report(recipe, 1, false));
      const double measured =
          double(Trainer(recipe, testing::quiet_options()).run().peak_allocated_bytes);
      INFO(family << ", recompute " << mode << ": predicted " << predicted << " B, measured "
                  << measured << " B");
      CHECK(std::abs(predicted - measured) <= kBar * measured);
    }
  }
}

TEST_CASE("the dry run's prediction holds in the 8B's FP8 and offload modes, within 1%",
          "[train][memory]") {
  // The tiny Llama with the settings of the previous case, in the modes a CPU rank runs only
  // as tests do (FP8 simulated with the GPU's bytes and scales, the offloaded optimizer's
  // pipeline on host buffers): FP8 in every block, FP8 weight gathers, and the 8B's own
  // configuration (FP8 delayed scaling with the first and last blocks in bf16, the offloaded
  // update overlapped, 2 of the 4 blocks recomputed). On a CPU rank the offloaded buffers
  // come from the same allocator as the rest, so the measured peak is compared with the
  // predicted device peak plus the predicted page-locked host memory. FP8 simulated on a CPU
  // rank keeps the GPU's bytes: the values a GPU cast computes as it reads them are computed
  // on the CPU outside the counted allocator (kernels/fp8.cc).
  const std::vector<std::vector<std::string>> modes = {
      {"mixed_precision.fp8_recipe=delayed", "mixed_precision.first_last_layers_bf16=false"},
      {"mixed_precision.fp8_param=true"},
      {"mixed_precision.fp8_recipe=delayed", "optimizer.cpu_offload=true",
       "optimizer.overlap_cpu_offload=true", "model.activation_recompute=full",
       "model.recompute_num_layers=2"}};
  for (const std::vector<std::string>& mode : modes) {
    const std::vector<std::string> overrides =
        with(with(with(tiny_run(), kLlamaSettings), {"mixed_precision.fp8=hybrid"}), mode);
    const Recipe recipe = load_recipe("tests/train/golden/llama_tiny.json", overrides);
    // The dry run as a GPU rank would make it (a CPU rank refuses cpu_offload).
    const std::string report = dry_run_report(
        load_recipe("tests/train/golden/llama_tiny.json", with(overrides, {"dist.device=auto"})),
        1, /*assume_cuda=*/true);
    const double predicted = predicted_peak_bytes(report) + predicted_host_bytes(report);
    TrainerOptions options = testing::quiet_options();
    options.simulate_fp8_on_cpu = true;
    options.offload_on_cpu = true;
    const TrainResult result = Trainer(recipe, options).run();
    REQUIRE_FALSE(result.fp8.layers.empty());
    const double measured = double(result.peak_allocated_bytes);
    std::string settings;
    for (const std::string& m : mode) settings += m + " ";
    INFO(settings << ": predicted " << predicted << " B, measured " << measured << " B");
    CHECK(std::abs(predicted - measured) <= kBar * measured);
  }
}

}  // namespace
}  // namespace fsdp::train
