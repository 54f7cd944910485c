// Bad launches, in process: a recipe that cannot run on this world fails on every rank with
// a ConfigError naming the offending key, before anything trains or any output is written
// (an impossible mesh, tensor parallelism, a global batch that does not split over the
// data-parallel ranks, an unknown sharding strategy). A valid recipe with the same settings
// trains, so each failure is its key's doing. Run plainly and under mpirun -np 2 / -np 4;
// tests/train/bad_launch_test.sh checks the same through the train binary and mpirun.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/llmc_shards.h"
#include "runtime/train/recipe.h"
#include "runtime/train/trainer.h"
#include "runtime/train/trainer_setup.h"
#include "tests/test_support.h"
#include "tests/train/scratch_dir.h"

using namespace fsdp;
using namespace fsdp::train;
using Catch::Matchers::Contains;

namespace {

// This rank's own directory (ranks never touch each other's files), with a token file.
struct Scratch {
  std::string dir, tokens, output;
  explicit Scratch(const std::string& name) {
    dir = testing::scratch_dir(name + "_rank" + std::to_string(testing::world_rank()));
    tokens = dir + "/tokens.bin";
    std::vector<int32_t> t(2000);
    for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t((i * 5 + i / 7) % 96);
    data::write_llmc_shard(tokens, t.data(), t.size());
    output = dir + "/run";
  }
};

// A tiny GPT-2 run of one step, plus `overrides`.
Recipe tiny_recipe(const Scratch& s, std::vector<std::string> overrides) {
  const std::string json = R"({
    "model": {"family": "gpt2", "n_layer": 1, "n_head": 2, "d_model": 16, "vocab_size": 96,
              "padded_vocab_size": 128, "seq_length": 8},
    "dataset": {"type": "llmc", "val_path": null, "val_fraction": 0},
    "train": {"train_iters": 1, "micro_batch_size": 1, "eval_interval": 0, "eval_iters": 0},
    "dist": {"device": "cpu"},
    "checkpoint": {"save": null, "load": null},
    "logger": {"log_interval": 1, "metrics_file": "metrics.jsonl"}
  })";
  overrides.insert(overrides.begin(), {"dataset.train_path=" + s.tokens, "run.output_dir=" + s.output});
  return parse_recipe(json, overrides, "launch_errors_test");
}

TrainerOptions quiet() {
  TrainerOptions o;
  o.out = nullptr;
  o.print_sample = false;
  return o;
}

// The Trainer refuses `recipe` with a ConfigError whose message names `key`, and leaves no
// output directory.
void check_refused(const Scratch& s, const Recipe& recipe, const std::string& key) {
  INFO(testing::world_size() << " rank(s), rank " << testing::world_rank() << ", expecting '" << key << "'");
  CHECK_THROWS_WITH(Trainer(recipe, quiet()), Contains(key));
  CHECK_THROWS_AS(Trainer(recipe, quiet()), ConfigError);
  CHECK_FALSE(std::filesystem::exists(s.output));
}

}  // namespace

TEST_CASE("a valid tiny recipe trains (the control for the refusals below)", "[train][mpi]") {
  Scratch s("launch_ok");
  const int n = testing::world_size();
  Trainer trainer(tiny_recipe(s, {"train.global_batch_size=" + std::to_string(2 * n)}), quiet());
  const TrainResult r = trainer.run();
  CHECK(r.steps == 1);
  if (testing::world_rank() == 0) CHECK(std::filesystem::exists(s.output + "/run_config.json"));
}

TEST_CASE("an impossible mesh is refused on every rank, naming the key", "[train][mpi]") {
  Scratch s("launch_mesh");
  const int n = testing::world_size();
  // 3 replicas cannot divide 1, 2 or 4 ranks; nor can a shard group of n + 1.
  check_refused(s, tiny_recipe(s, {"dist.dp_outer=3"}), "dist.dp_outer");
  check_refused(s, tiny_recipe(s, {"dist.dp_shard=" + std::to_string(n + 1)}), "dist.dp_shard");
  // 3 tensor-parallel ranks (of 3 heads, and 3 x 128 vocabulary rows) cannot divide 1, 2
  // or 4 ranks.
  check_refused(s, tiny_recipe(s, {"model.d_model=24", "model.n_head=3",
                                   "model.padded_vocab_size=384",
                                   "model.tensor_model_parallel_size=3"}),
                "model.tensor_model_parallel_size");
}

TEST_CASE("ddp.nccl_ub reaches the sharding options on CUDA and is ignored on the CPU",
          "[train]") {
  for (bool cuda : {false, true}) {
    Recipe r = parse_recipe("{}", {"ddp.nccl_ub=true", "ddp.nccl_ub_registration=local",
                                   std::string("dist.device=") + (cuda ? "cuda" : "cpu")});
    r.resolve_device(cuda);
    const FsdpOptions o = fsdp_options_of(r);
    CHECK(o.nccl_ub == cuda);
    CHECK(o.nccl_ub_kind == BufferRegistration::local);
  }
  Recipe off = parse_recipe("{}", {"dist.device=cuda"});
  off.resolve_device(true);
  CHECK_FALSE(fsdp_options_of(off).nccl_ub);
  CHECK(fsdp_options_of(off).nccl_ub_kind == BufferRegistration::symmetric);
}

TEST_CASE("cpu offload is refused where it has no meaning, naming the key", "[train][mpi]") {
  Scratch s("launch_offload");
  const int n = testing::world_size();
  const std::string batch = "train.global_batch_size=" + std::to_string(2 * n);
  // On the CPU every buffer is in host memory already; and only AdamW is offloaded.
  check_refused(s, tiny_recipe(s, {batch, "optimizer.cpu_offload=true"}), "optimizer.cpu_offload");
  CHECK_THROWS_AS(tiny_recipe(s, {batch, "optimizer.cpu_offload=true", "optimizer.optimizer=sgd"}),
                  ConfigError);
  CHECK_THROWS_WITH(tiny_recipe(s, {batch, "optimizer.cpu_offload=true", "optimizer.optimizer=sgd"}),
                    Contains("optimizer.cpu_offload"));
  // The overlapped update needs the offload and ZeRO-3's per-unit gathers.
  CHECK_THROWS_WITH(tiny_recipe(s, {batch, "optimizer.overlap_cpu_offload=true"}),
                    Contains("optimizer.overlap_cpu_offload"));
  CHECK_THROWS_WITH(tiny_recipe(s, {batch, "optimizer.cpu_offload=true", "optimizer.overlap_cpu_offload=true",
                                    "ddp.data_parallel_sharding_strategy=optim"}),
                    Contains("optim_grads_params"));
}

TEST_CASE("a global batch that does not split over micro-batches and ranks is refused",
          "[train][mpi]") {
  Scratch s("launch_batch");
  const int n = testing::world_size();
  // Not a multiple of the micro-batch: refused while reading the recipe, on any world.
  CHECK_THROWS_AS(tiny_recipe(s, {"train.micro_batch_size=2", "train.global_batch_size=3"}), ConfigError);
  CHECK_THROWS_WITH(tiny_recipe(s, {"train.micro_batch_size=2", "train.global_batch_size=3"}),
                    Contains("train.global_batch_size"));
  // A multiple of the micro-batch but not of micro-batch x data-parallel size: refused once
  // the world is known.
  if (n > 1) {
    const Recipe r = tiny_recipe(s, {"train.micro_batch_size=1", "train.global_batch_size=" + std::to_string(n + 1)});
    check_refused(s, r, "train.global_batch_size");
  }
}

TEST_CASE("an unknown sharding strategy is refused while reading the recipe", "[train][mpi]") {
  Scratch s("launch_strategy");
  for (const char* bad : {"zero9", "4", "optim_params", "fsdp"}) {
    INFO("strategy " << bad);
    const std::string o = std::string("ddp.data_parallel_sharding_strategy=") + bad;
    CHECK_THROWS_AS(tiny_recipe(s, {o}), ConfigError);
    CHECK_THROWS_WITH(tiny_recipe(s, {o}), Contains("ddp.data_parallel_sharding_strategy"));
  }
  // The integer codes are names too.
  CHECK(tiny_recipe(s, {"ddp.data_parallel_sharding_strategy=2"}).ddp.data_parallel_sharding_strategy ==
        "optim_grads");
}

TEST_CASE("a run predicted not to fit in memory is refused before anything is allocated",
          "[train]") {
  Scratch s("too_big");
  // About 160 billion parameters: no host or GPU holds their weights, let alone training.
  const Recipe r = tiny_recipe(s, {"model.n_layer=200", "model.d_model=8192", "model.n_head=64"});
  try {
    Trainer trainer(r, quiet());
    FAIL("the run was not refused");
  } catch (const ConfigError& e) {
    INFO(e.what());
    CHECK_THAT(e.what(), Contains("this run needs about") && Contains("model.n_layer") &&
                             Contains("--dry-run"));
  }
  CHECK_FALSE(std::filesystem::exists(s.output));
}

TEST_CASE("ranks started with different recipes are refused, naming the first differing key",
          "[train][mpi]") {
  const int n = testing::world_size();
  if (n == 1) return;  // needs a second rank to disagree with
  Scratch s("recipes_differ");
  const std::string batch = "train.global_batch_size=" + std::to_string(2 * n);
  // The last rank asks for another learning rate.
  const std::string lr = testing::world_rank() == n - 1 ? "optimizer.lr=0.002" : "optimizer.lr=0.001";
  try {
    Trainer trainer(tiny_recipe(s, {batch, lr}), quiet());
    FAIL("the run was not refused");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Contains("different recipes") && Contains("optimizer.lr"));
  }
  CHECK_FALSE(std::filesystem::exists(s.output));
}

TEST_CASE("an unwritable checkpoint.save is refused at start-up, not at the first save",
          "[train][mpi]") {
  Scratch s("save_unwritable");
  const int n = testing::world_size();
  // A file where the directory should be: nothing can be created under it.
  const std::string blocker = s.dir + "/blocker";
  { std::ofstream(blocker) << "x"; }
  // Each rank names its own blocker: the check runs on rank 0 and its verdict reaches all.
  check_refused(s, tiny_recipe(s, {"train.global_batch_size=" + std::to_string(2 * n),
                                   "checkpoint.save=" + blocker + "/ckpt"}),
                "checkpoint.save");
}

TEST_CASE("a finished run never fails in its end-of-run sample", "[train][mpi]") {
  // The vocabulary (96) cannot hold the GPT-2 tokenizer's, so no sample is drawn; the run
  // still trains and returns normally.
  Scratch s("no_sample");
  const int n = testing::world_size();
  TrainerOptions options = quiet();
  options.print_sample = true;
  Trainer trainer(tiny_recipe(s, {"train.global_batch_size=" + std::to_string(2 * n)}), options);
  const TrainResult r = trainer.run();
  CHECK(r.steps == 1);
  CHECK(r.sample.empty());
}

TEST_CASE("a validation split too short for one sample names the split and dataset.val_fraction",
          "[train][mpi]") {
  // 2000 tokens of llm.c shard: the last 0.004 are 8 tokens, too few for seq_length 8 + 1.
  Scratch s("launch_val_split");
  const int n = testing::world_size();
  const Recipe recipe = tiny_recipe(s, {"train.global_batch_size=" + std::to_string(2 * n),
                                        "dataset.val_fraction=0.004", "train.eval_interval=1",
                                        "train.eval_iters=1"});
  CHECK_THROWS_AS(Trainer(recipe, quiet()), DataError);
  CHECK_THROWS_WITH(Trainer(recipe, quiet()),
                    Contains("validation split (the last dataset.val_fraction = 0.004 of "
                             "dataset.train_path) of llm.c shards '" + s.tokens +
                             "' (tokens [1992, 2000) of 2000): 8 tokens are too few"));
  // A larger fraction (20 tokens) trains, and validates on that tail.
  Trainer trainer(tiny_recipe(s, {"train.global_batch_size=" + std::to_string(2 * n),
                                  "dataset.val_fraction=0.01", "train.eval_interval=1",
                                  "train.eval_iters=1"}),
                  quiet());
  CHECK(trainer.run().steps == 1);
}
