// CPU offload (optimizer.cpu_offload) under tensor and context parallelism, on CPU ranks: the
// offloaded AdamW (runtime/optim/offload_step.h) runs on the CPU too
// (TrainerOptions::offload_on_cpu: the same chunked pipeline, its copies synchronous), so the
// layouts that need a GPU per rank prove its numbers here. Under mpirun -np 4: TP2 x ZeRO-3
// x DP2 (the update in step and overlapped with the next forward) and CP2 x ZeRO-1 x DP2, for
// a tiny GPT-2 and Llama, each against the single process with offload and against the same
// layout without it.
//
// The offloaded AdamW keeps f32 master weights, so these runs are f32, and their curves agree
// to f32's rounding, not to f64's 1e-12: the layouts add in other orders (the row-parallel
// products, the data-parallel reductions; 1e-7 relative per sum), and the offloaded update
// computes in f32 where the in-device CPU update computes in f64 before rounding to f32. Over
// 12 steps the losses then move apart by at most 6e-8 relative and the gradient norms by
// 2e-7 (measured, every layout and both models); the bound below, 2e-6, is ten times that,
// and far below what a wrong layout gives (a parameter updated twice, a gradient scaled by
// the group size or left unsummed: 1e-2 and more).
#include <cmath>
#include <string>
#include <vector>

#include "runtime/train/recipe.h"
#include "runtime/train/trainer.h"
#include "tests/test_support.h"
#include "tests/train/short_run.h"

namespace fsdp::train {
namespace {

constexpr int kSteps = 12;
constexpr double kTolerance = 2e-6;

TrainResult train(const std::string& model, const std::string& tag,
                  const std::vector<std::string>& layout, bool offload, bool alone = false) {
  const std::vector<std::string> overrides = testing::with(
      testing::short_run("offload_layouts", tag, kSteps),
      {"scheduler.lr_warmup_iters=2", "mixed_precision.compute_dtype=f32",
       "mixed_precision.main_params_dtype=f32", "mixed_precision.grad_reduce_dtype=f32",
       "optimizer.moments_dtype=f32", "train.micro_batch_size=2",
       std::string("optimizer.cpu_offload=") + (offload ? "true" : "false")});
  TrainerOptions options = testing::quiet_options(alone);
  options.offload_on_cpu = true;
  return Trainer(load_recipe("tests/train/golden/" + model + ".json", testing::with(overrides, layout)),
                 options).run();
}

void check_close(const TrainResult& got, const TrainResult& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.losses.size() == size_t(kSteps));
  REQUIRE(want.losses.size() == size_t(kSteps));
  for (size_t i = 0; i < got.losses.size(); ++i) {
    INFO("step " << i + 1 << ": " << got.losses[i] << " against " << want.losses[i]);
    CHECK(std::abs(got.losses[i] - want.losses[i]) <= kTolerance * std::abs(want.losses[i]));
    CHECK(std::abs(got.grad_norms[i] - want.grad_norms[i]) <= kTolerance * std::abs(want.grad_norms[i]));
  }
}

struct Layout {
  std::string name;
  std::vector<std::string> keys;
  bool overlap = false;  // the offloaded update overlapped with the next forward (ZeRO-3)
};

void check_model(const std::string& model) {
  // The single process, with offload: rank 0 trains alone while the others wait for it in
  // their first layout's collectives.
  TrainResult reference;
  if (testing::world_rank() == 0)
    reference = train(model, model + "_offload_alone", {"ddp.data_parallel_sharding_strategy=no_shard"},
                      true, true);
  const std::vector<Layout> layouts = {
      {"TP2 x ZeRO-3 x DP2", {"model.tensor_model_parallel_size=2",
                              "ddp.data_parallel_sharding_strategy=optim_grads_params"}},
      {"TP2 x ZeRO-3 x DP2, the update overlapped with the next forward",
       {"model.tensor_model_parallel_size=2", "ddp.data_parallel_sharding_strategy=optim_grads_params"},
       true},
      {"CP2 x ZeRO-1 x DP2", {"model.context_parallel_size=2",
                              "ddp.data_parallel_sharding_strategy=optim"}},
  };
  for (size_t i = 0; i < layouts.size(); ++i) {
    const Layout& l = layouts[i];
    const std::string tag = model + "_layout" + std::to_string(i);
    std::vector<std::string> offload_keys = l.keys;
    if (l.overlap) offload_keys.push_back("optimizer.overlap_cpu_offload=true");
    const TrainResult offloaded = train(model, tag + "_offload", offload_keys, true);
    const TrainResult in_device = train(model, tag, l.keys, false);
    check_close(offloaded, in_device, model + ", " + l.name + ": offloaded against in-device");
    if (testing::world_rank() == 0)
      check_close(offloaded, reference, model + ", " + l.name + ": against the single process");
  }
}

TEST_CASE("CPU offload under tensor and context parallelism follows the single process",
          "[train][mpi]") {
  if (testing::world_size() != 4) return;  // the layouts need 4 ranks (the _np4 test)
  check_model("gpt2_tiny");
  check_model("llama_tiny");
}

}  // namespace
}  // namespace fsdp::train
