// FP8 training (mixed_precision.fp8) in the trainer, on the CPU's simulation of FP8 (the
// GPU's bytes and scales; products in f64): a tiny GPT-2 and a tiny Llama train with their
// blocks' linear layers in FP8 (e4m3 and hybrid), close to their bf16-free runs but not
// equal to them (the quantization is really applied); under mpirun -np 2 ZeRO-1 and ZeRO-3
// with gradient accumulation give the single-process FP8 losses within 1e-12 (every rank
// quantizes the whole gathered weight and its own micro-batches, as one process does).
// And the refusals: fp8 on a CPU run, the recipes and fp8_param this build lacks.
#include <cmath>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/llmc_shards.h"
#include "runtime/train/recipe.h"
#include "runtime/train/trainer.h"
#include "tests/test_support.h"
#include "tests/train/byte_tokens.h"
#include "tests/train/scratch_dir.h"

namespace fsdp::train {
namespace {

constexpr int kSteps = 30;

Recipe recipe_of(const std::string& model, const std::string& tag,
                 const std::vector<std::string>& extra) {
  std::vector<std::string> overrides = {
      "dataset.train_path=" + testing::byte_tokens_shard("fp8"),
      "run.output_dir=" + testing::scratch_dir(tag + "_rank" + std::to_string(testing::world_rank())),
      "logger.samples_file=null", "logger.log_update_norms=false",
      "train.train_iters=" + std::to_string(kSteps), "train.eval_interval=0",
      "scheduler.lr_decay_iters=" + std::to_string(kSteps),
      // Both blocks of the tiny models in FP8 (the default keeps the first and last in bf16).
      "mixed_precision.first_last_layers_bf16=false"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return load_recipe("tests/train/golden/" + model + ".json", overrides);
}

TrainResult train(const std::string& model, const std::string& tag,
                  const std::vector<std::string>& extra, bool alone = false) {
  TrainerOptions options;
  options.out = nullptr;
  options.print_sample = false;
  options.alone = alone;
  options.simulate_fp8_on_cpu = true;
  return Trainer(recipe_of(model, tag, extra), options).run();
}

double mean_of_last(const std::vector<double>& v, size_t n) {
  double s = 0;
  for (size_t i = v.size() - n; i < v.size(); ++i) s += v[i] / double(n);
  return s;
}

void check_close_to_unquantized(const std::string& model, const std::string& fp8) {
  const TrainResult plain = train(model, model + "_plain", {}, true);
  const TrainResult q = train(model, model + "_" + fp8, {"mixed_precision.fp8=" + fp8}, true);
  REQUIRE(q.losses.size() == size_t(kSteps));
  REQUIRE(plain.losses.size() == size_t(kSteps));
  INFO(model << " " << fp8 << ": last losses " << q.losses.back() << " against "
             << plain.losses.back());
  // The products are really quantized: the first step's loss already differs.
  CHECK(q.losses[0] != plain.losses[0]);
  // Both blocks' four linear layers (qkv, attention proj, fc or gate_up, MLP proj).
  CHECK(q.fp8_layers.size() == 8);
  CHECK(q.fp8_bf16_blocks.empty());
  CHECK(plain.fp8_layers.empty());
  // ... and the model learns as the unquantized one does: the mean of the last 5 losses
  // within 0.05 of it (its fall from ln 256 = 5.55 is about 2), every loss finite.
  for (double l : q.losses) CHECK(std::isfinite(l));
  CHECK(mean_of_last(q.losses, 5) < q.losses[0] - 1.0);
  CHECK(std::abs(mean_of_last(q.losses, 5) - mean_of_last(plain.losses, 5)) < 0.05);
}

TEST_CASE("fp8 training follows the unquantized curve on the CPU simulation", "[train][fp8]") {
  if (testing::world_size() != 1) return;
  check_close_to_unquantized("gpt2_tiny", "hybrid");
  check_close_to_unquantized("llama_tiny", "e4m3");
}

TEST_CASE("the fp8 plan keeps the first and last blocks in bf16 by default", "[train][fp8]") {
  if (testing::world_size() != 1) return;
  const TrainResult r = train("gpt2_tiny", "fp8_default",
                              {"mixed_precision.fp8=e4m3", "mixed_precision.first_last_layers_bf16=true",
                               "train.train_iters=2"},
                              true);
  CHECK(r.fp8_layers.empty());
  CHECK(r.fp8_bf16_blocks == std::vector<std::string>{"h.0", "h.1"});
}

TEST_CASE("fp8 gives the single-process losses under ZeRO-1 and ZeRO-3", "[train][fp8][mpi]") {
  if (testing::world_size() != 2) return;
  for (const std::string strategy : {"optim", "optim_grads_params"}) {
    const std::vector<std::string> extra = {"mixed_precision.fp8=hybrid",
                                            "ddp.data_parallel_sharding_strategy=" + strategy,
                                            "train.micro_batch_size=2"};
    TrainResult reference;
    if (testing::world_rank() == 0) reference = train("gpt2_tiny", "fp8_alone_" + strategy, extra, true);
    const TrainResult got = train("gpt2_tiny", "fp8_" + strategy, extra);
    REQUIRE(got.losses.size() == size_t(kSteps));
    if (testing::world_rank() != 0) continue;
    for (size_t i = 0; i < got.losses.size(); ++i) {
      INFO(strategy << " step " << i + 1 << ": " << got.losses[i] << " against " << reference.losses[i]);
      CHECK(std::abs(got.losses[i] - reference.losses[i]) <= 1e-12 * reference.losses[i]);
    }
  }
}

TEST_CASE("fp8 is refused where it cannot run, naming the key", "[train][fp8]") {
  if (testing::world_size() != 1) return;
  TrainerOptions options;
  options.out = nullptr;
  options.print_sample = false;
  CHECK_THROWS_WITH(Trainer(recipe_of("gpt2_tiny", "fp8_cpu", {"mixed_precision.fp8=e4m3"}), options),
                    Catch::Matchers::Contains("'mixed_precision.fp8' \"e4m3\" needs a GPU"));
  CHECK_THROWS_WITH(recipe_of("gpt2_tiny", "fp8_delayed",
                              {"mixed_precision.fp8=e4m3", "mixed_precision.fp8_recipe=delayed"}),
                    Catch::Matchers::Contains("'mixed_precision.fp8_recipe' \"delayed\""));
  CHECK_THROWS_WITH(recipe_of("gpt2_tiny", "fp8_param",
                              {"mixed_precision.fp8=e4m3", "mixed_precision.fp8_param=true"}),
                    Catch::Matchers::Contains("'mixed_precision.fp8_param'"));
  CHECK_THROWS_WITH(recipe_of("gpt2_tiny", "fp8_bad", {"mixed_precision.fp8=e3m4"}),
                    Catch::Matchers::Contains("mixed_precision.fp8"));
}

}  // namespace
}  // namespace fsdp::train
