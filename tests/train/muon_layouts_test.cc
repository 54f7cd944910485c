// Muon (optimizer.optimizer=muon) under sharding, in f64 on CPU ranks: a tiny GPT-2, a tiny
// Llama and a tiny Llama MoE train 100 steps at every sharding strategy on 2 and 4 ranks (and
// micro-batches of 1 and 2), HSDP on 4 ranks, under tensor parallelism (TP2; TP2 x ZeRO-3 x
// DP2 and TP4, whose Llama key/value heads are shared by two ranks each, on 4 ranks)
// and expert parallelism (EP2 at ZeRO-3), and each curve must equal the single process's
// within 1e-12 relative, loss by loss and gradient norm by gradient norm. On 4 ranks a ZeRO-3
// run's checkpoint (Muon's momentum as exp_avg, in global coordinates) resumes under
// TP2 x ZeRO-3 x DP2 on the saving run's curve.
//
// Why the layouts agree: every matrix is orthogonalized whole, once, by its owner, with the
// same operations as on one rank (the gather and the owners' sum with zeros are exact), so the
// only differences are the gradients' summation orders that the AdamW layouts already show
// (data-parallel reductions, tensor-parallel partial products: about 1e-15 per step). 1e-12
// lets those grow over 100 steps, and a matrix updated twice, left out, or orthogonalized
// from a partial gradient moves the curve by 1e-3 and more.
#include <cmath>
#include <string>
#include <vector>

#include "runtime/train/recipe.h"
#include "runtime/train/trainer.h"
#include "tests/test_support.h"
#include "tests/train/scratch_dir.h"
#include "tests/train/short_run.h"

namespace fsdp::train {
namespace {

constexpr int kSteps = 100;
constexpr double kTolerance = 1e-12;

// The tiny Llama with 4 experts of which each token takes 2, after one dense block; micro-batches
// of 2 everywhere (the balancing loss is a micro-batch's, so the reference must split alike).
const std::vector<std::string> kMoe = {"model.num_moe_experts=4", "model.moe_router_topk=2",
                                       "model.moe_ffn_hidden_size=32", "model.moe_first_k_dense_replace=1",
                                       "model.moe_aux_loss_coeff=0.01", "train.micro_batch_size=2"};

TrainResult train(const std::string& model, const std::string& tag, std::vector<std::string> keys,
                  bool alone = false) {
  keys.push_back("optimizer.optimizer=muon");
  keys.push_back("scheduler.lr_warmup_iters=10");
  return Trainer(load_recipe("tests/train/golden/" + model + ".json",
                             testing::with(testing::short_run("muon_layouts", tag, kSteps), keys)),
                 testing::quiet_options(alone))
      .run();
}

void check_same(const TrainResult& got, const TrainResult& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.losses.size() == size_t(kSteps));
  REQUIRE(want.losses.size() == size_t(kSteps));
  for (size_t i = 0; i < got.losses.size(); ++i) {
    INFO("step " << i + 1 << ": loss " << got.losses[i] << " against " << want.losses[i]
                 << ", gradient norm " << got.grad_norms[i] << " against " << want.grad_norms[i]);
    CHECK(std::abs(got.losses[i] - want.losses[i]) <= kTolerance * std::abs(want.losses[i]));
    CHECK(std::abs(got.grad_norms[i] - want.grad_norms[i]) <= kTolerance * std::abs(want.grad_norms[i]));
  }
}

struct Layout {
  std::string name;
  std::vector<std::string> keys;
  int ranks = 0;  // 0: any
};

std::vector<Layout> layouts() {
  std::vector<Layout> out;
  for (const char* s : {"no_shard", "optim", "optim_grads", "optim_grads_params"}) {
    for (int micro : {1, 2})
      out.push_back({str_cat(s, ", micro-batch ", micro),
                     {str_cat("ddp.data_parallel_sharding_strategy=", s),
                      str_cat("train.micro_batch_size=", micro)}});
  }
  out.push_back({"TP2 at ZeRO-1", {"model.tensor_model_parallel_size=2", "ddp.data_parallel_sharding_strategy=optim"}, 2});
  out.push_back({"TP2 x ZeRO-3 x DP2",
                 {"model.tensor_model_parallel_size=2", "ddp.data_parallel_sharding_strategy=optim_grads_params"}, 4});
  out.push_back({"HSDP: ZeRO-3 over 2 x 2 replicas",
                 {"dist.dp_outer=2", "train.micro_batch_size=2", "ddp.data_parallel_sharding_strategy=optim_grads_params"}, 4});
  // The Llama's 2 key/value heads on 4 ranks: each held by 2 (made whole from the first).
  out.push_back({"TP4", {"model.tensor_model_parallel_size=4", "train.micro_batch_size=8"}, 4});
  return out;
}

void check_model(const std::string& model, const std::vector<std::string>& extra,
                 const std::vector<Layout>& cases) {
  const std::string name = model + (extra.empty() ? "" : " MoE");
  TrainResult reference;
  if (testing::world_rank() == 0) reference = train(model, name + "_alone", extra, true);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Layout& l = cases[i];
    if (l.ranks != 0 && l.ranks != testing::world_size()) continue;
    const TrainResult got =
        train(model, name + "_layout" + std::to_string(i), testing::with(extra, l.keys));
    if (testing::world_rank() == 0) check_same(got, reference, name + ", " + l.name);
  }
}

TEST_CASE("Muon on sharded weights follows the single process at every layout", "[train][mpi][muon]") {
  if (testing::world_size() < 2) return;  // the _np2 and _np4 tests
  check_model("gpt2_tiny", {}, layouts());
  check_model("llama_tiny", {}, layouts());
  check_model("llama_tiny", kMoe,
              {{"EP2 at ZeRO-3", {"model.expert_model_parallel_size=2",
                                  "ddp.data_parallel_sharding_strategy=optim_grads_params"}},
               {"ZeRO-1", {"ddp.data_parallel_sharding_strategy=optim"}}});
}

TEST_CASE("a Muon checkpoint resumes under another layout on the same curve", "[train][mpi][muon]") {
  if (testing::world_size() != 4) return;
  const std::string save =
      testing::shared_dir("muon_checkpoint", testing::world_rank(), testing::world_size());
  const TrainResult whole =
      train("llama_tiny", "muon_saver", {"ddp.data_parallel_sharding_strategy=optim_grads_params",
                                         "train.micro_batch_size=2", "checkpoint.save=" + save,
                                         "checkpoint.save_interval=50"});
  const TrainResult resumed =
      train("llama_tiny", "muon_resumer", {"model.tensor_model_parallel_size=2",
                                           "ddp.data_parallel_sharding_strategy=optim_grads_params",
                                           "checkpoint.load=" + save + "/step_000050", "checkpoint.save=null"});
  REQUIRE(resumed.first_step == 50);
  REQUIRE(resumed.losses.size() == size_t(kSteps - 50));
  for (size_t i = 0; i < resumed.losses.size(); ++i) {
    INFO("step " << 51 + i << ": " << resumed.losses[i] << " against " << whole.losses[50 + i]);
    CHECK(std::abs(resumed.losses[i] - whole.losses[50 + i]) <= kTolerance * whole.losses[50 + i]);
  }
}

}  // namespace
}  // namespace fsdp::train
