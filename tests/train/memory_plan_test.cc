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

// "  predicted peak    203 MiB" in a dry run's report -> bytes.
double predicted_peak_bytes(const std::string& report) {
  const size_t at = report.find("predicted peak");
  REQUIRE(at != std::string::npos);
  std::istringstream line(report.substr(at + std::string("predicted peak").size()));
  double value = 0;
  std::string unit;
  line >> value >> unit;
  const double scale = unit == "B" ? 1 : unit == "KiB" ? 1024.0 : unit == "MiB" ? 1048576.0
                     : unit == "GiB" ? 1073741824.0 : 0;
  REQUIRE(scale > 0);
  return value * scale;
}

TEST_CASE("the dry run's predicted peak is the peak a run measures, within 3%",
          "[train][memory]") {
  // On a CPU rank, whose allocator holds the same tensors a GPU's does: tiny shapes whose
  // activations are most of the memory (so that a tensor the plan misses shows), for both
  // families and every recompute mode. The bar is the one the GPU's table meets
  // (scripts/memory_table.sh). GPT-2 runs as its golden recipe does (f64, no_shard); the
  // Llama with the 8B's settings as far as a CPU rank has them: ZeRO-3, f32 master weights
  // and compute (bf16 on a GPU), bf16 moments.
  const std::vector<std::string> llama_settings = {
      "ddp.data_parallel_sharding_strategy=optim_grads_params",
      "mixed_precision.compute_dtype=f32", "mixed_precision.main_params_dtype=f32",
      "mixed_precision.grad_reduce_dtype=f32", "optimizer.moments_dtype=bf16"};
  for (const char* family : {"llama", "gpt2"}) {
    for (const char* mode : {"none", "selective", "full", "full3"}) {
      const bool some = mode == std::string("full3");  // the first 3 of the 4 blocks
      std::vector<std::string> overrides = with(
          short_run("memory_plan", "memory_plan", 2),
          {"scheduler.lr_warmup_iters=1", "model.n_layer=4", "model.d_model=128",
           "model.n_head=4", "model.d_ff=384", "model.seq_length=512",
           "train.micro_batch_size=4", "train.global_batch_size=4",
           std::string("model.activation_recompute=") + (some ? "full" : mode)});
      if (some) overrides.push_back("model.recompute_num_layers=3");
      if (family == std::string("llama")) overrides = with(overrides, llama_settings);
      const Recipe recipe =
          load_recipe(str_cat("tests/train/golden/", family, "_tiny.json"), overrides);
      const double predicted = predicted_peak_bytes(dry_run_report(recipe, 1, false));
      const double measured =
          double(Trainer(recipe, testing::quiet_options()).run().peak_allocated_bytes);
      INFO(family << ", recompute " << mode << ": predicted " << predicted << " B, measured "
                  << measured << " B");
      CHECK(std::abs(predicted - measured) <= 0.03 * measured);
    }
  }
}

}  // namespace
}  // namespace fsdp::train
