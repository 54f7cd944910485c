// Mixture-of-experts models in the trainer, in f64 on the CPU: a tiny Llama MoE (softmax,
// aux_loss, z-loss, a shared expert) and a tiny GPT-2 MoE (sigmoid scores with an expert
// bias, seq_aux_loss, a dense first layer) train with a falling loss and report their
// auxiliary losses and load; and under mpirun -np 2 and -np 4, with ZeRO-1 and ZeRO-3 and
// gradient accumulation, give the loss sequence of the single-process run with the same
// micro-batches (which rank 0 trains alone, TrainerOptions::alone) within 1e-12; so do
// expert parallelism's layouts (EP2 and EP4 beside ZeRO-1 / ZeRO-3 over the experts' own
// data-parallel group, which has one rank under EP4 and EP2 on 2 ranks), whose all-to-alls
// and expert-group collectives are counted. A checkpoint saved at one layout (EP2 among
// them) resumes at others (EP1, EP4; and EP1 into EP2) on the same curve within 1e-12,
// expert biases included. Context parallelism (CP2, CP2 x DP2, CP2 x EP2) and tensor
// parallelism with its sequence split (TP2, TP2 x EP2, TP2 x CP2) too: each rank holds a
// part of every sequence, and the balancing loss (aux_loss and seq_aux_loss) counts the
// choices of every part, as the single process does. The Llama also trains with its shared
// expert computed beside the dispatch (model.moe_shared_expert_overlap: one process, EP2,
// EP4, EP2 x CP2), against the single process doing the same.
//
// The same micro-batch size on both sides: the load-balancing loss of a micro-batch is not
// the mean of its halves' (f_e P_e is a product of two means), so, as in Megatron, the
// micro-batch size is part of the objective; the data-parallel layout is not.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/llmc_shards.h"
#include "runtime/train/metrics.h"
#include "runtime/train/recipe.h"
#include "runtime/train/trainer.h"
#include "tests/test_support.h"
#include "tests/train/short_run.h"

namespace fsdp::train {
namespace {

using testing::with;

constexpr int kSteps = 30;

// The two tiny MoE models, as overrides of the golden-curve recipes.
std::vector<std::string> moe_overrides(const std::string& name) {
  if (name == "llama_tiny")
    return {"model.num_moe_experts=4", "model.moe_router_topk=2", "model.moe_ffn_hidden_size=32",
            "model.moe_shared_expert_intermediate_size=32", "model.moe_aux_loss_coeff=0.01",
            "model.moe_z_loss_coeff=0.001"};
  return {"model.num_moe_experts=4", "model.moe_router_topk=2", "model.moe_ffn_hidden_size=64",
          "model.moe_first_k_dense_replace=1", "model.moe_router_score_function=sigmoid",
          "model.moe_router_enable_expert_bias=true", "model.moe_router_bias_update_rate=0.01",
          "model.moe_router_load_balancing_type=seq_aux_loss", "model.moe_aux_loss_coeff=0.01"};
}

struct Layout {
  std::string strategy;
  int micro_batch;  // of the global batch of 8 sequences
  int ep = 1;       // model.expert_model_parallel_size
  int cp = 1;       // model.context_parallel_size
  int tp = 1;       // model.tensor_model_parallel_size, with sequence parallelism
  bool overlap = false;  // model.moe_shared_expert_overlap (the models with a shared expert)
};

TrainResult train(const std::string& name, const Layout& layout, bool alone,
                  const std::vector<std::string>& extra = {}) {
  const std::string tag = name + "_" + layout.strategy + "_mb" + std::to_string(layout.micro_batch) +
                          "_ep" + std::to_string(layout.ep) + "_cp" + std::to_string(layout.cp) + "_tp" + std::to_string(layout.tp) +
                          (layout.overlap ? "_overlap" : "") + (alone ? "_alone" : "");
  const std::vector<std::string> overrides = with(testing::short_run("moe", tag, kSteps), {
      "ddp.data_parallel_sharding_strategy=" + layout.strategy,
      "train.micro_batch_size=" + std::to_string(layout.micro_batch),
      "model.expert_model_parallel_size=" + std::to_string(layout.ep),
      "model.context_parallel_size=" + std::to_string(layout.cp),
      "model.tensor_model_parallel_size=" + std::to_string(layout.tp),
      std::string("model.sequence_parallel=") + (layout.tp > 1 ? "true" : "false"),
      std::string("model.moe_shared_expert_overlap=") + (layout.overlap ? "true" : "false")});
  const Recipe recipe = load_recipe("tests/train/golden/" + name + ".json",
                                    with(with(overrides, moe_overrides(name)), extra));
  return Trainer(recipe, testing::quiet_options(alone)).run();
}

// The layouts run by a world of this size; those with the shared expert overlapped only for
// a model that has one (its single-process reference overlaps it too).
std::vector<Layout> layouts(bool shared_expert) {
  std::vector<Layout> all;
  switch (testing::world_size()) {
    case 1:
      all = {{"no_shard", 4}, {"optim_grads_params", 2}, {"optim_grads_params", 2, 1, 1, 1, true}};
      break;
    case 2:
      all = {{"optim_grads_params", 2}, {"optim", 2}, {"optim_grads_params", 4},
             {"optim_grads_params", 2, 2}, {"optim", 1, 2}, {"optim_grads_params", 2, 1, 2},
             {"optim_grads_params", 2, 1, 1, 2}, {"optim_grads_params", 2, 2, 1, 1, true}};
      break;
    case 4:
      all = {{"optim_grads_params", 1}, {"optim", 1}, {"optim_grads_params", 2},
             {"optim_grads_params", 1, 2}, {"optim", 1, 2}, {"optim_grads_params", 1, 4},
             {"optim", 2, 4}, {"optim", 1, 1, 2}, {"optim_grads_params", 1, 2, 2},
             {"optim", 1, 2, 1, 2}, {"optim_grads_params", 2, 1, 2, 2},
             {"optim_grads_params", 1, 4, 1, 1, true}, {"optim", 1, 2, 2, 1, true}};
      break;
    default: break;
  }
  std::vector<Layout> out;
  for (const Layout& l : all)
    if (shared_expert || !l.overlap) out.push_back(l);
  return out;
}

// The MoE layers of the two tiny models (gpt2_tiny's first layer is dense).
int moe_layers(const std::string& name) { return name == "llama_tiny" ? 2 : 1; }

// What expert parallelism communicates per step: each MoE layer's forward exchanges the
// counts, the rows and the rows back, its backward the rows' gradients both ways; per
// experts unit, ZeRO-3 gathers the experts in forward and again in backward (except the
// last block's, kept from its forward: both models' last layer is MoE) and reduce-scatters
// every micro-batch, ZeRO-1 reduce-scatters once and gathers the update once; the gradient
// norm gathers the experts' block sums once per step. Over a group
// of one rank the FSDP collectives do not run.
void check_expert_counts(const std::string& name, const Layout& layout, const TrainResult& r) {
  const uint64_t steps = kSteps, layers = uint64_t(moe_layers(name));
  // The data-parallel ranks: those that do not split a sequence among them.
  const int dp = testing::world_size() / (layout.cp * layout.tp);
  const uint64_t accum = uint64_t(8 / (layout.micro_batch * dp));
  const int expert_dp = testing::world_size() / (layout.ep * layout.tp);
  INFO("expert collectives: " << r.moe.expert_all_to_alls << " all-to-alls, " << r.moe.expert_all_gathers
                              << " all-gathers, " << r.moe.expert_reduce_scatters << " reduce-scatters");
  if (layout.ep == 1) {
    CHECK(r.moe.expert_all_to_alls + r.moe.expert_all_gathers + r.moe.expert_reduce_scatters == 0);
    return;
  }
  CHECK(r.moe.expert_all_to_alls == steps * accum * layers * 5);
  const bool zero3 = layout.strategy == "optim_grads_params";
  // (And once per step the gradient norm gathers the experts units' block sums.)
  const uint64_t gathers =
      expert_dp == 1 ? 0 : (zero3 ? steps * accum * (layers * 2 - 1) : steps * layers) + steps;
  const uint64_t reduces = expert_dp == 1 ? 0 : zero3 ? steps * accum * layers : steps * layers;
  CHECK(r.moe.expert_all_gathers == gathers);
  CHECK(r.moe.expert_reduce_scatters == reduces);
}

void check_model(const std::string& name) {
  for (const Layout& layout : layouts(name == "llama_tiny")) {
    // Rank 0 trains the single-process run alone first; the other ranks wait for it in the
    // layout's first collective.
    TrainResult reference;
    if (testing::world_rank() == 0)
      reference = train(name, {"no_shard", layout.micro_batch, 1, 1, 1, layout.overlap}, true);
    const TrainResult got = train(name, layout, false);
    INFO(name << " on " << testing::world_size() << " rank(s), " << layout.strategy
              << ", micro-batch " << layout.micro_batch << ", ep " << layout.ep << ", cp "
              << layout.cp << ", tp " << layout.tp << (layout.overlap ? ", shared expert overlapped" : ""));
    check_expert_counts(name, layout, got);
    REQUIRE(got.losses.size() == size_t(kSteps));
    REQUIRE(got.moe.aux_losses.size() == size_t(kSteps));
    REQUIRE(got.moe.max_loads.size() == size_t(kSteps));
    // Learning: the last steps' loss well below the first's (ln 256 = 5.55 at the start).
    double last = 0;
    for (int i = kSteps - 5; i < kSteps; ++i) last += got.losses[size_t(i)] / 5;
    CHECK(last < got.losses[0] - 0.5);
    for (size_t i = 0; i < got.losses.size(); ++i) {
      CHECK(got.moe.aux_losses[i] > 0);
      CHECK(got.moe.max_loads[i] >= 1.0);
      CHECK(got.moe.max_loads[i] <= 4.0);  // E / 1 at worst: every token on one expert
    }
    if (testing::world_rank() != 0) continue;
    REQUIRE(reference.losses.size() == got.losses.size());
    for (size_t i = 0; i < got.losses.size(); ++i) {
      INFO("step " << i + 1 << ": " << got.losses[i] << " against " << reference.losses[i]);
      CHECK(std::abs(got.losses[i] - reference.losses[i]) <= 1e-12 * reference.losses[i]);
      CHECK(std::abs(got.moe.aux_losses[i] - reference.moe.aux_losses[i]) <=
            1e-12 * reference.moe.aux_losses[i]);
      CHECK(got.moe.max_loads[i] == reference.moe.max_loads[i]);  // counts: exact
    }
  }
}

TEST_CASE("a tiny Llama MoE trains alike on every layout", "[train][moe][mpi]") {
  check_model("llama_tiny");
}

TEST_CASE("a tiny GPT-2 MoE with an expert bias trains alike on every layout",
          "[train][moe][mpi]") {
  check_model("gpt2_tiny");
}

std::string shared_dir(const std::string& name) {
  return testing::shared_dir(name, testing::world_rank(), testing::world_size());
}

std::string describe(const Layout& l) {
  return l.strategy + " micro-batch " + std::to_string(l.micro_batch) + " ep " + std::to_string(l.ep) +
         " cp " + std::to_string(l.cp) + " tp " + std::to_string(l.tp);
}

// `name` trained at layout `saving` for kSteps, saving at step 15, then resumed from that
// checkpoint at each of `resumes` (the same micro-batch size: it is part of the objective):
// each continues the saving run's losses within 1e-12 and its routing (the largest expert
// load, from counts: exact), whatever the expert-parallel size on either side.
void check_resumes(const std::string& name, const Layout& saving, const std::vector<Layout>& resumes) {
  const std::string save = shared_dir(name + "_" + saving.strategy + "_ep" + std::to_string(saving.ep) +
                                      "_cp" + std::to_string(saving.cp) + "_tp" + std::to_string(saving.tp));
  const TrainResult whole =
      train(name, saving, false, {"checkpoint.save=" + save, "checkpoint.save_interval=15"});
  REQUIRE(whole.losses.size() == size_t(kSteps));
  REQUIRE(whole.moe.max_loads.size() == size_t(kSteps));
  for (const Layout& layout : resumes) {
    INFO(name << " saved at " << describe(saving) << ", resumed at " << describe(layout));
    const TrainResult tail = train(name, layout, false,
                                   {"checkpoint.load=" + save + "/step_000015", "checkpoint.save=null"});
    REQUIRE(tail.first_step == 15);
    REQUIRE(tail.losses.size() == size_t(kSteps - 15));
    REQUIRE(tail.moe.max_loads.size() == size_t(kSteps - 15));
    for (size_t i = 0; i < tail.losses.size(); ++i) {
      INFO("step " << i + 16 << ": " << tail.losses[i] << " against " << whole.losses[i + 15]);
      CHECK(std::abs(tail.losses[i] - whole.losses[i + 15]) <= 1e-12 * whole.losses[i + 15]);
      CHECK(tail.moe.max_loads[i] == whole.moe.max_loads[i + 15]);
    }
  }
}

TEST_CASE("an MoE run resumes from its checkpoint on the same curve", "[train][moe][mpi]") {
  // gpt2_tiny's expert bias is saved and restored with the weights: without it the resumed
  // routing, and so the curve, would differ from the first resumed step on.
  switch (testing::world_size()) {
    case 1:
      check_resumes("llama_tiny", {"no_shard", 4}, {{"optim_grads_params", 4}});
      check_resumes("gpt2_tiny", {"no_shard", 4}, {{"no_shard", 4}, {"optim_grads_params", 4}});
      break;
    case 2:
      // Experts saved split over 2 ranks resume whole, and the other way round.
      check_resumes("llama_tiny", {"optim_grads_params", 2, 2}, {{"optim", 2, 1}});
      check_resumes("gpt2_tiny", {"optim_grads_params", 2, 2}, {{"optim_grads_params", 2, 1}});
      check_resumes("llama_tiny", {"optim_grads_params", 2, 1}, {{"optim", 2, 2}});
      // Saved under tensor parallelism (router and experts whole on each rank, the shared
      // expert split), resumed without it and under context parallelism.
      check_resumes("llama_tiny", {"optim_grads_params", 2, 1, 1, 2},
                    {{"optim", 2, 1}, {"optim_grads_params", 2, 1, 2}});
      break;
    case 4:
      // EP2 with ZeRO-3 over the experts' group of 2 (and ZeRO-1, and no_shard, whose files
      // hold one expert-parallel rank's experts each) into EP1 and EP4, either strategy.
      check_resumes("llama_tiny", {"optim_grads_params", 1, 2},
                    {{"optim", 1, 1}, {"optim_grads_params", 1, 4}, {"optim", 1, 4}});
      check_resumes("gpt2_tiny", {"optim", 1, 2}, {{"optim_grads_params", 1, 4}, {"optim_grads_params", 1, 1}});
      check_resumes("gpt2_tiny", {"no_shard", 1, 2}, {{"optim", 1, 4}});
      // Experts split over 2 expert-parallel ranks and whole on 2 tensor-parallel ones.
      check_resumes("llama_tiny", {"optim_grads_params", 1, 2, 1, 2},
                    {{"optim", 1, 4}, {"optim_grads_params", 1, 1, 2}});
      break;
    default:
      break;
  }
}

TEST_CASE("the MoE metrics reach metrics.jsonl", "[train][moe]") {
  if (testing::world_size() != 1) return;
  const std::string out = testing::scratch_dir("moe_metrics");
  std::vector<std::string> overrides = {"dataset.train_path=" + testing::byte_tokens_shard("moe"),
                                        "run.output_dir=" + out, "logger.samples_file=null",
                                        "train.train_iters=3", "train.eval_interval=0",
                                        "scheduler.lr_warmup_iters=1",
                                        "logger.log_expert_tokens=true"};
  const TrainResult r = Trainer(load_recipe("tests/train/golden/llama_tiny.json",
                                            with(overrides, moe_overrides("llama_tiny"))),
                                testing::quiet_options()).run();
  const std::vector<StepMetrics> records = read_metrics_file(out + "/metrics.jsonl");
  REQUIRE(records.size() == 3);
  for (size_t i = 0; i < records.size(); ++i) {
    REQUIRE(records[i].moe_aux_loss);
    CHECK(*records[i].moe_aux_loss == r.moe.aux_losses[i]);
    REQUIRE(records[i].moe_z_loss);
    // Two MoE layers of 4 experts: each layer's z-loss is about ln(4)^2 at the start.
    CHECK(*records[i].moe_z_loss > 0);
    REQUIRE(records[i].moe_max_load);
    // Tokens per expert, per layer: every layer routes the step's tokens k times each, and the
    // load is the busiest expert's count over the mean.
    const auto& tokens = records[i].moe_expert_tokens;
    REQUIRE(tokens.size() == 2);
    double load = 0;
    for (const std::vector<int64_t>& layer : tokens) {
      REQUIRE(layer.size() == 4);
      int64_t total = 0, most = 0;
      for (int64_t c : layer) total += c, most = std::max(most, c);
      CHECK(total == std::accumulate(tokens[0].begin(), tokens[0].end(), int64_t(0)));
      load = std::max(load, double(most) / (double(total) / 4));
    }
    CHECK(load == *records[i].moe_max_load);
  }
  // 2 layers, each about 1 when balanced (between 1 and E = 4).
  CHECK(r.moe.aux_losses[0] >= 2.0 * 0.99);
  CHECK(r.moe.aux_losses[0] <= 8.0);
}

}  // namespace
}  // namespace fsdp::train
