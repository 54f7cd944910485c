// Resuming through the Trainer: a run saved at step 10 and resumed to step 20 gives the same
// losses, bit for bit, as an uninterrupted 20-step run, for every strategy; a stop request
// saves a checkpoint that resumes exactly; another model shape is refused; --no-resume and
// checkpoint.load=null start fresh. Run plainly and under mpirun -np 2 / -np 4 (each run
// resumes with the world size it was saved with; tests/checkpoint/reshard_test.cc and
// train_signal_test.sh change it).
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/checkpoint/save.h"
#include "runtime/data/llmc_shards.h"
#include "runtime/train/metrics.h"
#include "runtime/train/recipe.h"
#include "runtime/train/trainer.h"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tools/convert/hf_export.h"
#include "tools/convert/hf_import.h"
#include "tests/test_support.h"

using namespace fsdp;
using namespace fsdp::train;
using Catch::Matchers::Contains;

namespace {

// A token shard of a learnable pattern over a vocabulary of 96, written once by rank 0.
std::string write_tokens(const std::string& dir) {
  const std::string path = dir + "/tokens.bin";
  if (testing::world_rank() == 0) {
    std::vector<int32_t> tokens(6000);
    uint64_t h = 12345;
    for (size_t i = 0; i < tokens.size(); ++i) {
      h = h * 6364136223846793005ull + 1442695040888963407ull;
      tokens[i] = (h >> 60) == 0 ? int32_t((h >> 33) % 96) : int32_t((i * 5 + i / 7) % 96);
    }
    data::write_llmc_shard(path, tokens.data(), tokens.size());
  }
  testing::barrier_all_ranks();
  return path;
}

// A tiny GPT-2 recipe on that data: 20 steps of 8 sequences (every world size of 1, 2, 4
// sees the same global batches), saving every 10 steps into dir/ckpt.
Recipe tiny_recipe(const std::string& dir, const std::string& data, std::vector<std::string> overrides) {
  const std::string json = R"({
    "model": {"family": "gpt2", "n_layer": 2, "n_head": 4, "d_model": 32, "vocab_size": 96,
              "padded_vocab_size": 128, "seq_length": 16},
    "dataset": {"type": "llmc", "val_path": null, "val_fraction": 0, "seed": 7},
    "train": {"train_iters": 20, "micro_batch_size": 2, "global_batch_size": 8,
              "eval_interval": 0, "eval_iters": 0},
    "optimizer": {"lr": 0.01, "min_lr": 0.001, "weight_decay": 0.1, "clip_grad": 1.0},
    "scheduler": {"lr_decay_style": "cosine", "lr_warmup_iters": 3},
    "dist": {"device": "cpu"},
    "checkpoint": {"load": "latest", "save_interval": 10, "most_recent_k": 0},
    "logger": {"log_interval": 1, "metrics_file": "metrics.jsonl"},
    "run": {"name": "resume-test", "seed": 3}
  })";
  overrides.insert(overrides.begin(), {"dataset.train_path=" + data, "checkpoint.save=" + dir + "/ckpt",
                                       "run.output_dir=" + dir + "/run"});
  return parse_recipe(json, overrides, "resume_test");
}

TrainResult run_training(const Recipe& recipe, bool resume = true) {
  TrainerOptions options;
  options.out = nullptr;
  options.print_sample = false;
  options.resume = resume;
  Trainer trainer(recipe, options);
  return trainer.run();
}

void check_bitwise(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("step " << i << ": " << got[i] << " vs " << want[i]);
    CHECK(std::memcmp(&got[i], &want[i], sizeof(double)) == 0);
  }
}

std::vector<double> tail(const std::vector<double>& v, size_t from) {
  return std::vector<double>(v.begin() + long(from), v.end());
}

}  // namespace

TEST_CASE("save at step 10 and resume to step 20 equals an uninterrupted run, for every strategy",
          "[checkpoint][mpi]") {
  for (const char* strategy : {"no_shard", "optim", "optim_grads", "optim_grads_params"}) {
    INFO("strategy " << strategy << ", " << testing::world_size() << " ranks");
    const std::string dir = testing::shared_scratch_dir(std::string("resume_") + strategy);
    const std::string data = write_tokens(dir);
    const std::string s = std::string("ddp.data_parallel_sharding_strategy=") + strategy;

    // Uninterrupted, saving at steps 10 and 20.
    const TrainResult full = run_training(tiny_recipe(dir, data, {s}));
    REQUIRE(full.losses.size() == 20);
    CHECK(full.first_step == 0);
    CHECK(full.losses.back() < full.losses.front());  // it learns: equality proves something
    CHECK(checkpoint::read_latest_marker(dir + "/ckpt") == "step_000020");
    CHECK(std::filesystem::exists(dir + "/ckpt/step_000010/metadata.json"));
    std::vector<StepMetrics> logged;
    if (testing::world_rank() == 0) logged = read_metrics_file(dir + "/run/metrics.jsonl");

    // Resumed from step 10 into the same output directory, saving elsewhere.
    const TrainResult resumed = run_training(tiny_recipe(
        dir, data, {s, "checkpoint.load=" + dir + "/ckpt/step_000010", "checkpoint.save=" + dir + "/ckpt2"}));
    CHECK(resumed.first_step == 10);
    CHECK(resumed.steps == 20);
    check_bitwise(resumed.losses, tail(full.losses, 10));
    CHECK(checkpoint::read_latest_marker(dir + "/ckpt2") == "step_000020");

    // The metrics file kept steps 1-10 and holds the resumed steps after them: the same
    // 20 records as the uninterrupted run's.
    if (testing::world_rank() == 0) {
      const std::vector<StepMetrics> after = read_metrics_file(dir + "/run/metrics.jsonl");
      REQUIRE(after.size() == logged.size());
      for (size_t i = 0; i < after.size(); ++i) {
        CHECK(after[i].step == int64_t(i) + 1);
        CHECK(after[i].loss == logged[i].loss);
      }
    }
  }
}

TEST_CASE("a stop requested on one rank saves a checkpoint from which the run resumes exactly",
          "[checkpoint][mpi]") {
  const std::string dir = testing::shared_scratch_dir("stop");
  const std::string data = write_tokens(dir);
  const TrainResult full = run_training(tiny_recipe(dir, data, {"checkpoint.save=" + dir + "/reference"}));

  // Only the last rank is asked to stop, after its 7th step: every rank must agree. On the
  // CPU the trainer polls after every micro-batch but a step's last, and at the step's end:
  // `accum` polls per step, the 7 * accum-th at step 7's end.
  TrainerOptions options;
  options.out = nullptr;
  options.print_sample = false;
  const int accum = 8 / (2 * testing::world_size());
  int polls = 0;
  options.stop_requested = [&] {
    return testing::world_rank() == testing::world_size() - 1 && ++polls == 7 * accum;
  };
  TrainResult stopped;
  {
    Trainer trainer(tiny_recipe(dir, data, {"checkpoint.save_interval=0"}), options);
    stopped = trainer.run();
  }
  CHECK(stopped.stopped);
  CHECK(stopped.steps == 7);
  CHECK(checkpoint::read_latest_marker(dir + "/ckpt") == "step_000007");
  check_bitwise(stopped.losses, std::vector<double>(full.losses.begin(), full.losses.begin() + 7));

  // The default checkpoint.load (latest) picks it up.
  const TrainResult resumed = run_training(tiny_recipe(dir, data, {"checkpoint.save_interval=0"}));
  CHECK(resumed.first_step == 7);
  check_bitwise(resumed.losses, tail(full.losses, 7));
}

TEST_CASE("a checkpoint of another model shape is refused, naming the parameter", "[checkpoint][mpi]") {
  const std::string dir = testing::shared_scratch_dir("shape");
  const std::string data = write_tokens(dir);
  run_training(tiny_recipe(dir, data, {"train.train_iters=4"}));
  const auto before = testing::snapshot_directory(dir + "/ckpt");
  for (const char* other : {"model.d_model=64", "model.n_layer=3"}) {
    INFO(other);
    CHECK_THROWS_AS(run_training(tiny_recipe(dir, data, {other, "train.train_iters=4"})), CheckpointError);
    CHECK_THROWS_WITH(run_training(tiny_recipe(dir, data, {other, "train.train_iters=4"})),
                      Contains("does not fit this model: parameter \""));
  }
  CHECK_THROWS_WITH(run_training(tiny_recipe(dir, data, {"model.n_layer=3"})), Contains("\"h.2."));
  CHECK_THROWS_WITH(run_training(tiny_recipe(dir, data, {"model.d_model=64"})),
                    Contains("\"h.0.") && Contains(", 32) in the checkpoint but (") && Contains(", 64) in the model"));
  CHECK(testing::snapshot_directory(dir + "/ckpt") == before);
}

TEST_CASE("a resume with another dataset.seed is refused, naming the key and both values",
          "[checkpoint][mpi]") {
  const std::string dir = testing::shared_scratch_dir("data_seed");
  const std::string data = write_tokens(dir);
  run_training(tiny_recipe(dir, data, {"train.train_iters=4"}));  // saved with seed 7
  const Recipe other = tiny_recipe(dir, data, {"train.train_iters=8", "dataset.seed=8"});
  CHECK_THROWS_AS(run_training(other), ConfigError);
  CHECK_THROWS_WITH(run_training(other), Contains("dataset.seed = 8") &&
                                             Contains("step_000004") &&
                                             Contains("dataset.seed = 7") &&
                                             Contains("dataset.seed=7"));
  // The same seed resumes; a fresh start (replacing the checkpoints) may take any seed.
  CHECK(run_training(tiny_recipe(dir, data, {"train.train_iters=8"})).first_step == 4);
  const Recipe fresh = tiny_recipe(dir, data, {"train.train_iters=8", "dataset.seed=8",
                                               "checkpoint.overwrite=true"});
  CHECK(run_training(fresh, /*resume=*/false).first_step == 0);

  // So may a checkpoint that has read no data: `convert import`'s step 0 (saved with seed 0).
  if (testing::world_rank() == 0) {
    Context ctx;
    convert::ExportOptions no_batch;
    no_batch.check_batch = false;
    convert::export_hf(dir + "/ckpt", dir + "/hf", no_batch);
    convert::write_step0_checkpoint(ctx, convert::read_hf_model(ctx, dir + "/hf", 128),
                                    dir + "/imported");
  }
  testing::barrier_all_ranks();
  const TrainResult from_import = run_training(tiny_recipe(
      dir, data, {"train.train_iters=4", "dataset.seed=8", "checkpoint.load=" + dir + "/imported",
                  "checkpoint.save=" + dir + "/from_import"}));
  CHECK(from_import.first_step == 0);
  CHECK(from_import.steps == 4);
}

TEST_CASE("--no-resume and checkpoint.load=null start fresh; a load path without a checkpoint is an error",
          "[checkpoint][mpi]") {
  const std::string dir = testing::shared_scratch_dir("fresh");
  const std::string data = write_tokens(dir);
  const TrainResult first = run_training(tiny_recipe(dir, data, {"train.train_iters=4"}));
  REQUIRE(checkpoint::read_latest_marker(dir + "/ckpt") == "step_000004");

  // Starting fresh into a directory of checkpoints replaces them: refused unless asked for.
  CHECK_THROWS_WITH(run_training(tiny_recipe(dir, data, {"train.train_iters=4"}), /*resume=*/false),
                    Contains("holds another run's checkpoints") && Contains("checkpoint.overwrite=true"));
  CHECK(checkpoint::read_latest_marker(dir + "/ckpt") == "step_000004");
  const TrainResult no_resume = run_training(
      tiny_recipe(dir, data, {"train.train_iters=4", "checkpoint.overwrite=true"}), /*resume=*/false);
  CHECK(no_resume.first_step == 0);
  check_bitwise(no_resume.losses, first.losses);

  const TrainResult null_load = run_training(tiny_recipe(
      dir, data, {"train.train_iters=4", "checkpoint.load=null", "checkpoint.overwrite=true"}));
  CHECK(null_load.first_step == 0);
  check_bitwise(null_load.losses, first.losses);

  // The default resumes (and has nothing left to do at step 4 of 4).
  const TrainResult again = run_training(tiny_recipe(dir, data, {"train.train_iters=4"}));
  CHECK(again.first_step == 4);
  CHECK(again.losses.empty());

  CHECK_THROWS_AS(run_training(tiny_recipe(dir, data, {"checkpoint.load=" + dir + "/run"})), ConfigError);
}

TEST_CASE("a lost latest marker resumes from the newest complete step, not from scratch",
          "[checkpoint][mpi]") {
  const std::string dir = testing::shared_scratch_dir("no_latest");
  const std::string data = write_tokens(dir);
  // The reference: 20 steps without a break.
  const TrainResult full = run_training(tiny_recipe(dir, data, {"checkpoint.save=" + dir + "/reference"}));
  // 10 steps saved at 5 and 10, then the marker is lost (deleted by hand, a copy without it).
  run_training(tiny_recipe(dir, data, {"train.train_iters=10", "checkpoint.save_interval=5",
                                       "scheduler.lr_decay_iters=20"}));
  testing::barrier_all_ranks();
  if (testing::world_rank() == 0) std::filesystem::remove(dir + "/ckpt/latest");
  testing::barrier_all_ranks();
  const TrainResult resumed = run_training(tiny_recipe(dir, data, {}));
  CHECK(resumed.first_step == 10);
  check_bitwise(resumed.losses, tail(full.losses, 10));
  // The earlier step is kept (most_recent_k 0 in these recipes keeps every save).
  CHECK(std::filesystem::exists(dir + "/ckpt/step_000005/metadata.json"));
}
