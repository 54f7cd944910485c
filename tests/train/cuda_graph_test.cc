// train.cuda_graphs: which micro-batches are warmed up, captured, replayed or run eagerly
// (host-only plan); the recipe and the Trainer refuse what cannot be captured, naming the key;
// and on a GPU, training with graphs gives the same losses and the same final weights and
// optimizer state, bit for bit, as training without.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "runtime/core/context.h"
#include "runtime/core/error.h"
#include "runtime/data/llmc_shards.h"
#include "runtime/train/cuda_graph.h"
#include "runtime/train/recipe.h"
#include "runtime/train/trainer.h"
#include "tests/test_support.h"
#include "tests/train/scratch_dir.h"

using namespace fsdp;
using namespace fsdp::train;
using Catch::Matchers::Contains;
using Action = CudaGraphPlan::Action;

namespace {

const char* kTinyJson = R"({
  "model": {"family": "gpt2", "n_layer": 2, "n_head": 4, "d_model": 32, "vocab_size": 96,
            "padded_vocab_size": 128, "seq_length": 16},
  "dataset": {"type": "llmc", "val_path": null, "val_fraction": 0, "seed": 7},
  "train": {"train_iters": 4, "micro_batch_size": 2, "global_batch_size": 6,
            "eval_interval": 0, "eval_iters": 0},
  "optimizer": {"lr": 0.01, "min_lr": 0.001, "weight_decay": 0.1, "clip_grad": 1.0},
  "scheduler": {"lr_decay_style": "cosine", "lr_warmup_iters": 1},
  "ddp": {"data_parallel_sharding_strategy": "no_shard"},
  "checkpoint": {"save": null, "load": null, "save_interval": 0},
  "logger": {"log_interval": 1, "metrics_file": null},
  "run": {"name": "cuda-graph-test", "seed": 3}
})";

Recipe tiny(std::vector<std::string> overrides) {
  overrides.insert(overrides.begin(), "dataset.train_path=unused.bin");
  return parse_recipe(kTinyJson, overrides, "cuda_graph_test");
}

// A CUDA no_shard recipe that passed the recipe checks (the plan is tested without a GPU).
Recipe cuda_recipe(const std::string& strategy = "no_shard") {
  Recipe r = tiny({"dist.device=cpu"});
  r.dist.device = "cuda";
  r.train.cuda_graphs = true;
  r.ddp.data_parallel_sharding_strategy = strategy;
  return r;
}

std::vector<Action> steps_of(CudaGraphPlan plan, int64_t accum, int steps) {
  std::vector<Action> out;
  for (int s = 0; s < steps; ++s)
    for (int64_t m = 0; m < accum; ++m) out.push_back(plan.next(m == accum - 1));
  return out;
}

}  // namespace

TEST_CASE("cuda graphs plan: one rank replays every micro-batch after a warm-up and a capture",
          "[train][cuda_graphs]") {
  const CudaGraphPlan plan = CudaGraphPlan::of(cuda_recipe(), 1, 3, /*communicates=*/false);
  CHECK(plan.enabled());
  CHECK(plan.graphs_last());
  const std::vector<Action> want = {Action::WarmUp, Action::Capture, Action::Replay,
                                    Action::Replay, Action::Replay, Action::Replay};
  CHECK(steps_of(plan, 3, 2) == want);
  // One micro-batch per step: the warm-up and the capture fall in the first two steps.
  CHECK(steps_of(plan, 1, 3) == std::vector<Action>{Action::WarmUp, Action::Capture, Action::Replay});
}

TEST_CASE("cuda graphs plan: with collectives the last micro-batch of each step runs eagerly",
          "[train][cuda_graphs]") {
  const CudaGraphPlan plan = CudaGraphPlan::of(cuda_recipe(), 2, 3, /*communicates=*/true);
  CHECK_FALSE(plan.graphs_last());
  const std::vector<Action> want = {Action::WarmUp, Action::Capture, Action::Eager,
                                    Action::Replay, Action::Replay, Action::Eager};
  CHECK(steps_of(plan, 3, 2) == want);
  const CudaGraphPlan two = CudaGraphPlan::of(cuda_recipe(), 2, 2, true);
  const std::vector<Action> want2 = {Action::WarmUp, Action::Eager, Action::Capture, Action::Eager,
                                     Action::Replay, Action::Eager};
  CHECK(steps_of(two, 2, 3) == want2);
  // Collectives skipped (the benchmark's compute baseline): nothing to keep eager.
  CHECK(CudaGraphPlan::of(cuda_recipe(), 2, 1, false).graphs_last());
}

TEST_CASE("cuda graphs plan: off by default, and then every micro-batch is eager", "[train][cuda_graphs]") {
  const Recipe r = tiny({"dist.device=cpu"});
  CHECK_FALSE(r.train.cuda_graphs);
  const CudaGraphPlan plan = CudaGraphPlan::of(r, 1, 3, false);
  CHECK_FALSE(plan.enabled());
  CHECK(steps_of(plan, 3, 2) == std::vector<Action>(6, Action::Eager));
  CHECK(std::string(action_name(Action::Replay)) == "replay");
}

TEST_CASE("cuda graphs plan: refusals name train.cuda_graphs and the key to change", "[train][cuda_graphs]") {
  // Several ranks and one micro-batch per step: every micro-batch all-reduces.
  CHECK_THROWS_AS(CudaGraphPlan::of(cuda_recipe(), 2, 1, true), ConfigError);
  CHECK_THROWS_WITH(CudaGraphPlan::of(cuda_recipe(), 2, 1, true),
                    Contains("train.cuda_graphs") && Contains("train.global_batch_size"));
  for (const char* s : {"optim", "optim_grads", "optim_grads_params"}) {
    INFO(s);
    CHECK_THROWS_WITH(CudaGraphPlan::of(cuda_recipe(s), 1, 2, false),
                      Contains("train.cuda_graphs") && Contains("no_shard"));
  }
  Recipe cpu = cuda_recipe();
  cpu.dist.device = "cpu";
  CHECK_THROWS_WITH(CudaGraphPlan::of(cpu, 1, 2, false), Contains("train.cuda_graphs") && Contains("GPU"));
}

TEST_CASE("the recipe refuses train.cuda_graphs on a CPU device and with sharding strategies",
          "[train][cuda_graphs]") {
  CHECK_THROWS_AS(tiny({"dist.device=cpu", "train.cuda_graphs=true"}), ConfigError);
  CHECK_THROWS_WITH(tiny({"dist.device=cpu", "train.cuda_graphs=true"}),
                    Contains("train.cuda_graphs") && Contains("dist.device"));
  for (const char* s : {"optim", "optim_grads", "optim_grads_params", "3"}) {
    INFO(s);
    CHECK_THROWS_WITH(tiny({"dist.device=cuda", "train.cuda_graphs=true",
                            std::string("ddp.data_parallel_sharding_strategy=") + s}),
                      Contains("train.cuda_graphs") && Contains("ddp.data_parallel_sharding_strategy"));
  }
  // "auto" is settled by the device found: no GPU means no graphs.
  Recipe r = tiny({"dist.device=auto", "train.cuda_graphs=true"});
  CHECK(r.train.cuda_graphs);
  CHECK_THROWS_WITH(r.resolve_device(false), Contains("train.cuda_graphs") && Contains("no CUDA device"));
  CHECK_NOTHROW(tiny({"dist.device=cuda", "train.cuda_graphs=true"}));
  CHECK_THAT(recipe_help_text(), Contains("train.cuda_graphs"));
}

TEST_CASE("the Trainer refuses train.cuda_graphs on a CPU run before anything starts",
          "[train][cuda_graphs]") {
  const std::string dir = testing::scratch_dir("cuda_graphs_cpu");
  Recipe r = tiny({"dist.device=cpu", "run.output_dir=" + dir + "/run"});
  r.train.cuda_graphs = true;  // past the recipe checks, as a hand-built Recipe could be
  TrainerOptions o;
  o.out = nullptr;
  o.print_sample = false;
  CHECK_THROWS_AS(Trainer(r, o), ConfigError);
  CHECK_THROWS_WITH(Trainer(r, o), Contains("train.cuda_graphs"));
  CHECK_FALSE(std::filesystem::exists(dir + "/run"));
}

// ---------------------------------------------------------------- GPU

namespace {

// (2, 4) i32 tokens base, base + 1, ...
Tensor tokens(Context& ctx, int base) {
  std::vector<int32_t> v(8);
  for (int i = 0; i < 8; ++i) v[size_t(i)] = base + i;
  return ops::from_host<int32_t>(ctx, v, Shape{2, 4});
}

}  // namespace

TEST_CASE("MicroBatchGraph replays with each micro-batch's inputs and accumulates like eager runs",
          "[train][cuda_graphs][gpu]") {
  FSDP_REQUIRE_GPU();
  Context ctx(Device::cuda(0));
  // A persistent buffer the body accumulates into, as backward does into parameter gradients.
  const Tensor acc = ops::zeros(ctx, Shape{2, 4}, DType::f32);
  auto body = [&](const Tensor& idx, const Tensor& tgt) {
    Tensor x = ops::cast(ctx, idx, DType::f32);
    const Tensor y = ops::cast(ctx, tgt, DType::f32);
    ops::mul(ctx, x, x, y);
    ops::axpby(ctx, acc, 1.0, x);
    return ops::sum(ctx, x);
  };
  MicroBatchGraph graph(ctx, CudaGraphPlan::of(cuda_recipe(), 1, 1, false), [] {});
  std::vector<double> want_acc(8, 0.0);
  for (int m = 0; m < 5; ++m) {
    INFO("micro-batch " << m);
    double want = 0;
    for (int i = 0; i < 8; ++i) {
      want += double(m + i) * double(10 * m + i);
      want_acc[size_t(i)] += double(m + i) * double(10 * m + i);
    }
    const Tensor loss = graph.run(true, tokens(ctx, m), tokens(ctx, 10 * m), body);
    CHECK(ops::item(ctx, loss) == want);
  }
  CHECK(graph.captures() == 1);
  CHECK(graph.replays() == 4);  // the capturing launch and three replays; the first was eager
  // (acc is f32: read it as such; the sums are small whole numbers, exact in f32.)
  std::vector<double> got_acc;
  for (float v : ops::to_vector<float>(ctx, acc)) got_acc.push_back(double(v));
  CHECK(got_acc == want_acc);
}

TEST_CASE("MicroBatchGraph refuses, by name, what cannot be captured", "[train][cuda_graphs][gpu]") {
  FSDP_REQUIRE_GPU();
  Context ctx(Device::cuda(0));
  auto body = [&](const Tensor& idx, const Tensor&) { return ops::sum(ctx, ops::cast(ctx, idx, DType::f32)); };
  const CudaGraphPlan plan = CudaGraphPlan::of(cuda_recipe(), 1, 1, false);
  Tensor kept;  // outlives the graphs below
  SECTION("a host read-back (synchronization) inside the micro-batch") {
    MicroBatchGraph graph(ctx, plan, [] {});
    auto reads = [&](const Tensor& idx, const Tensor& tgt) {
      Tensor loss = body(idx, tgt);
      (void)ops::item(ctx, loss);
      return loss;
    };
    CHECK(ops::item(ctx, graph.run(true, tokens(ctx, 0), tokens(ctx, 0), reads)) == 28.0);  // eager
    std::string error = "no CudaError";
    try {
      graph.run(true, tokens(ctx, 1), tokens(ctx, 1), reads);
    } catch (const CudaError& e) {
      error = e.what();
    }
    CHECK_THAT(error, Contains("train.cuda_graphs") && Contains("capturing"));
  }
  SECTION("more memory at capture than the warm-up used") {
    MicroBatchGraph graph(ctx, plan, [] {});
    int calls = 0;
    auto growing = [&](const Tensor& idx, const Tensor& tgt) {
      Tensor loss = body(idx, tgt);
      if (++calls == 2) ops::fill(ctx, ctx.empty(Shape{1 << 20}, DType::f32), 1.0);
      return loss;
    };
    graph.run(true, tokens(ctx, 0), tokens(ctx, 0), growing);
    CHECK_THROWS_WITH(graph.run(true, tokens(ctx, 1), tokens(ctx, 1), growing),
                      Contains("train.cuda_graphs") && Contains("private memory pool"));
  }
  SECTION("a tensor made inside the micro-batch that outlives it") {
    MicroBatchGraph graph(ctx, plan, [] {});
    auto leaking = [&](const Tensor& idx, const Tensor& tgt) {
      kept = ops::cast(ctx, idx, DType::f32);
      return body(idx, tgt);
    };
    graph.run(true, tokens(ctx, 0), tokens(ctx, 0), leaking);
    CHECK_THROWS_WITH(graph.run(true, tokens(ctx, 1), tokens(ctx, 1), leaking),
                      Contains("train.cuda_graphs") && Contains("outlive"));
  }
  // The context still works after a failed capture.
  CHECK(ops::item(ctx, body(tokens(ctx, 2), tokens(ctx, 2))) == 44.0);
}

namespace {

std::string write_tokens(const std::string& dir) {
  const std::string path = dir + "/tokens.bin";
  std::vector<int32_t> tokens(6000);
  uint64_t h = 12345;
  for (size_t i = 0; i < tokens.size(); ++i) {
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    tokens[i] = (h >> 60) == 0 ? int32_t((h >> 33) % 96) : int32_t((i * 5 + i / 7) % 96);
  }
  data::write_llmc_shard(path, tokens.data(), tokens.size());
  return path;
}

struct Run {
  TrainResult result;
  std::map<std::string, std::string> files;  // the final checkpoint's tensor files: name -> bytes
};

Run train_on_gpu(const std::string& dir, const std::string& name, std::vector<std::string> overrides) {
  const std::string data = write_tokens(dir);
  // train.matmul_tuning=false: timing picks each matmul's algorithm anew in every run, and
  // these runs are compared bit for bit (graphs against eager, eager against eager).
  overrides.insert(overrides.begin(), {"dist.device=cuda", "train.matmul_tuning=false",
                                       "dataset.train_path=" + data,
                                       "checkpoint.save=" + dir + "/" + name + "/ckpt",
                                       "run.output_dir=" + dir + "/" + name + "/run"});
  const Recipe recipe = parse_recipe(kTinyJson, overrides, name);
  TrainerOptions o;
  o.out = nullptr;
  o.print_sample = false;
  Run run;
  {
    Trainer trainer(recipe, o);
    run.result = trainer.run();
  }
  // Master weights and optimizer moments, as saved; metadata.json holds the recipe, which
  // differs in train.cuda_graphs.
  const std::string step_dir = dir + "/" + name + "/ckpt/step_000004";
  REQUIRE(std::filesystem::is_directory(step_dir));
  for (const auto& e : std::filesystem::directory_iterator(step_dir)) {
    if (!e.is_regular_file() || e.path().filename() == "metadata.json") continue;
    std::ifstream in(e.path(), std::ios::binary);
    run.files[e.path().filename().string()] =
        std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  REQUIRE_FALSE(run.files.empty());
  return run;
}

void check_same(const Run& a, const Run& b) {
  REQUIRE(a.result.losses.size() == b.result.losses.size());
  for (size_t i = 0; i < a.result.losses.size(); ++i) {
    INFO("step " << i + 1 << ": " << a.result.losses[i] << " vs " << b.result.losses[i]);
    CHECK(std::memcmp(&a.result.losses[i], &b.result.losses[i], sizeof(double)) == 0);
  }
  REQUIRE(a.files.size() == b.files.size());
  for (const auto& [name, bytes] : a.files) {
    INFO("checkpoint file " << name);
    REQUIRE(b.files.count(name) == 1);
    CHECK(bytes.size() == b.files.at(name).size());
    CHECK(bytes == b.files.at(name));
  }
}

}  // namespace

TEST_CASE("CUDA graphs train bit for bit like eager runs (losses, final weights and moments)",
          "[train][cuda_graphs][gpu]") {
  FSDP_REQUIRE_GPU();
  const std::vector<std::pair<std::string, std::vector<std::string>>> variants = {
      {"gpt2", {}},
      {"gpt2_recompute", {"model.activation_recompute=full"}},
      {"gpt2_selective", {"model.activation_recompute=selective"}},
      {"llama", {"model.family=llama", "model.n_kv_head=2", "model.tie_embeddings=false"}},
  };
  for (const auto& [name, extra] : variants) {
    SECTION(name) {
      const std::string dir = testing::scratch_dir("cuda_graphs_" + name);
      auto with = [&](std::vector<std::string> more) {
        more.insert(more.end(), extra.begin(), extra.end());
        return more;
      };
      const Run eager = train_on_gpu(dir, "eager", with({}));
      const Run eager2 = train_on_gpu(dir, "eager2", with({}));
      const Run graphed = train_on_gpu(dir, "graphed", with({"train.cuda_graphs=true"}));
      REQUIRE(eager.result.losses.size() == 4);
      CHECK(eager.result.losses.back() < eager.result.losses.front());  // it learns
      // The control: without graphs the run is reproducible, so equality below means something.
      INFO("eager vs eager");
      check_same(eager, eager2);
      CHECK(eager.result.cuda_graph_replays == 0);
      // 4 steps of 3 micro-batches: a warm-up, then 11 launches (the capturing one included).
      CHECK(graphed.result.cuda_graph_replays == 11);
      INFO("eager vs cuda graphs");
      check_same(eager, graphed);
    }
  }
}
