// FP8 training (mixed_precision.fp8): refused on the CPU and on GPUs without FP8 tensor cores
// before anything starts; the dry run and the start-up report name the FP8 layers; and on a
// GPU (compute capability 8.9+) a tiny GPT-2 and a tiny Llama trained in FP8 hold the bf16
// loss curve.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/error.h"
#include "runtime/data/llmc_shards.h"
#include "runtime/train/dry_run.h"
#include "runtime/train/recipe.h"
#include "runtime/train/trainer.h"
#include "runtime/train/trainer_setup.h"
#include "tests/test_support.h"
#include "tests/train/scratch_dir.h"

using namespace fsdp;
using namespace fsdp::train;
using Catch::Matchers::Contains;

namespace {

// Every size a multiple of 16, as FP8 matmuls need: d 64, qkv 192, d_ff 256, 4 x 64 tokens.
const char* kTinyJson = R"({
  "model": {"family": "gpt2", "n_layer": 4, "n_head": 4, "d_model": 64, "vocab_size": 96,
            "padded_vocab_size": 128, "seq_length": 64},
  "dataset": {"type": "llmc", "val_path": null, "val_fraction": 0, "seed": 7},
  "train": {"train_iters": 60, "micro_batch_size": 4, "global_batch_size": 8,
            "eval_interval": 0, "eval_iters": 0},
  "optimizer": {"lr": 0.003, "min_lr": 0.0003, "weight_decay": 0.1, "clip_grad": 1.0},
  "scheduler": {"lr_decay_style": "cosine", "lr_warmup_iters": 5},
  "ddp": {"data_parallel_sharding_strategy": "optim_grads_params"},
  "checkpoint": {"save": null, "load": null, "save_interval": 0},
  "logger": {"log_interval": 10, "metrics_file": null},
  "run": {"name": "fp8-test", "seed": 3}
})";

Recipe tiny(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), "dataset.train_path=unused.bin");
  return parse_recipe(kTinyJson, overrides, "fp8_train_test");
}

// A token stream with structure to learn (a mostly periodic sequence, some noise).
std::string write_tokens(const std::string& dir) {
  const std::string path = dir + "/tokens.bin";
  std::vector<int32_t> tokens(40000);
  uint64_t h = 12345;
  for (size_t i = 0; i < tokens.size(); ++i) {
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    tokens[i] = (h >> 60) == 0 ? int32_t((h >> 33) % 96) : int32_t((i * 5 + i / 7) % 96);
  }
  data::write_llmc_shard(path, tokens.data(), tokens.size());
  return path;
}

struct Run {
  std::vector<double> losses;
  std::string report;  // what the run printed
};

Run train_on_gpu(const std::string& dir, const std::string& name, std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), {"dist.device=cuda", "dataset.train_path=" + write_tokens(dir),
                                       "run.output_dir=" + dir + "/" + name});
  TrainerOptions o;
  o.print_sample = false;
  o.alone = true;
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  o.out = out;
  Run run;
  {
    Trainer trainer(parse_recipe(kTinyJson, overrides, name), o);
    run.losses = trainer.run().losses;
  }
  std::rewind(out);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), out)) > 0) run.report.append(buf, n);
  std::fclose(out);
  return run;
}

double mean(const std::vector<double>& v, size_t from, size_t to) {
  double s = 0;
  for (size_t i = from; i < to; ++i) s += v[i];
  return s / double(to - from);
}

}  // namespace

TEST_CASE("FP8 needs a GPU with FP8 tensor cores: the CPU and older GPUs are refused by key",
          "[train][fp8]") {
  const Recipe r = tiny({"mixed_precision.fp8=hybrid"});
  CHECK_THROWS_WITH(check_fp8_device(r, Device::cpu()),
                    Contains("'mixed_precision.fp8' \"hybrid\" needs a GPU with FP8 tensor cores"));
  const int cc = cuda_compute_capability(0);
  if (cc >= 89) {
    CHECK_NOTHROW(check_fp8_device(r, Device::cuda(0)));
  } else {
    // No GPU (capability 0) or one before Ada/Hopper.
    CHECK_THROWS_WITH(check_fp8_device(r, Device::cuda(0)),
                      Contains("needs FP8 tensor cores (compute capability 8.9+") &&
                          Contains(str_cat("compute capability ", cc / 10, ".", cc % 10)));
  }
  // Without FP8 nothing is asked of the device.
  CHECK_NOTHROW(check_fp8_device(tiny({}), Device::cpu()));
}

TEST_CASE("the Trainer refuses FP8 on the CPU before anything starts", "[train][fp8]") {
  // A CPU recipe passes its own checks only without FP8; set afterwards, the device
  // resolution refuses it.
  Recipe r = tiny({"dist.device=cpu"});
  r.mixed_precision.fp8 = "e4m3";
  TrainerOptions o;
  o.out = nullptr;
  o.alone = true;
  CHECK_THROWS_WITH(Trainer(r, o), Contains("'mixed_precision.fp8' \"e4m3\" needs a GPU") &&
                                       Contains("the CPU simulation of FP8 is for tests only"));
}

TEST_CASE("the dry run names the FP8 layers and the blocks kept in bf16", "[train][fp8]") {
  const std::string report =
      dry_run_report(tiny({"mixed_precision.fp8=hybrid", "mixed_precision.first_last_layers_bf16=true"}),
                     1, /*assume_cuda=*/true);
  CHECK_THAT(report, Contains("fp8: 8 linear layers of blocks 1..2 (attn.qkv, attn.proj, mlp.fc, "
                              "mlp.proj) in hybrid (f8e4m3 forward, e5m2 gradients), tensorwise "
                              "current scaling; in bf16: blocks 0, 3, the head"));
  CHECK_THAT(dry_run_report(tiny({}), 1, true), !Contains("fp8:"));
}

TEST_CASE("FP8 training holds the bf16 loss curve of a tiny GPT-2 and Llama", "[train][fp8][gpu]") {
  FSDP_REQUIRE_GPU();
  if (cuda_compute_capability(0) < 89) {
    testing::mark_skipped("the GPU has no FP8 tensor cores (compute capability < 8.9)");
    return;
  }
  const std::vector<std::pair<std::string, std::vector<std::string>>> models = {
      {"gpt2", {}},
      {"llama", {"model.family=llama", "model.n_kv_head=2", "model.tie_embeddings=false"}},
  };
  for (const auto& [model, extra] : models) {
    SECTION(model) {
      const std::string dir = testing::scratch_dir("fp8_" + model);
      auto with = [&](std::vector<std::string> more) {
        more.insert(more.end(), extra.begin(), extra.end());
        return more;
      };
      const Run bf16 = train_on_gpu(dir, "bf16", with({}));
      const Run hybrid = train_on_gpu(dir, "hybrid", with({"mixed_precision.fp8=hybrid"}));
      const Run e4m3 = train_on_gpu(dir, "e4m3", with({"mixed_precision.fp8=e4m3",
                                                        "mixed_precision.first_last_layers_bf16=true"}));
      REQUIRE(bf16.losses.size() == 60);
      CHECK_THAT(hybrid.report, Contains("fp8: 16 linear layers of blocks 0..3"));
      CHECK_THAT(e4m3.report, Contains("fp8: 8 linear layers of blocks 1..2"));
      CHECK_THAT(bf16.report, !Contains("fp8:"));
      // The bf16 run learns (from ln 96 = 4.56 to about 0.9 on this periodic stream), so
      // holding its curve means something; FP8 runs differ from it (they are not bf16 in
      // disguise) by a few percent at most, step by step after the warm-up and on average
      // over the last 10 steps. The CPU simulation of these runs (FP8 against f32, the
      // trainer's device check bypassed by hand) stayed within 0.4% at every step for both
      // models and both recipes; bf16's own rounding on the GPU adds to that, hence 5% and 2%
      // (not yet measured on a GPU).
      CHECK(mean(bf16.losses, 50, 60) < 0.7 * bf16.losses.front());
      for (const Run* r : {&hybrid, &e4m3}) {
        REQUIRE(r->losses.size() == 60);
        CHECK(r->losses != bf16.losses);
        for (size_t s = 5; s < 60; ++s) {
          INFO("step " << s + 1 << ": FP8 " << r->losses[s] << ", bf16 " << bf16.losses[s]);
          CHECK(std::fabs(r->losses[s] - bf16.losses[s]) < 0.05 * bf16.losses[s]);
        }
        CHECK(std::fabs(mean(r->losses, 50, 60) - mean(bf16.losses, 50, 60)) <
              0.02 * mean(bf16.losses, 50, 60));
      }
    }
  }
}
