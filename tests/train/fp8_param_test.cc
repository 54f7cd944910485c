// FP8 weight gathers (mixed_precision.fp8_param) on the CPU's simulation of FP8, under
// mpirun -np 2 with ZeRO-3: the FP8 layers' weights travel as FP8 bytes (one byte per
// element instead of the compute dtype's), and training gives the losses of the same run
// gathering its weights in the compute dtype, for both scaling recipes and both model
// families, through a checkpoint resumed with and without fp8_param. Under -np 4, tensor
// parallelism 2 x ZeRO-3 over 2 gives the single process's FP8 losses.
//
// Expected bytes: ZeRO-3 gathers each micro-batch the root once and every block twice
// (forward, backward) but the last, kept from its forward to its backward (the schedule of
// runtime/fsdp/schedule.cc, counted in tests/fsdp/collective_counts_test.cc); a block's FP8
// unit is gathered with it, padded_numel bytes instead of padded_numel elements.
#include <cmath>
#include <string>
#include <vector>

#include "models/factory.h"
#include "runtime/fsdp/plan.h"
#include "runtime/parallel/fp8_plan.h"
#include "runtime/parallel/tensor_parallel.h"
#include "runtime/train/recipe.h"
#include "runtime/train/trainer.h"
#include "runtime/train/trainer_setup.h"
#include "tests/test_support.h"
#include "tests/train/short_run.h"

namespace fsdp::train {
namespace {

using testing::with;

constexpr int kSteps = 12;

Recipe recipe_of(const std::string& model, const std::string& tag,
                 const std::vector<std::string>& extra) {
  const std::vector<std::string> overrides =
      with(testing::short_run("fp8_param", tag, kSteps),
           {"scheduler.lr_warmup_iters=2",
            // ZeRO-3 with two micro-batches per rank, every block in FP8.
            "ddp.data_parallel_sharding_strategy=optim_grads_params", "train.micro_batch_size=2",
            "mixed_precision.first_last_layers_bf16=false"});
  return load_recipe("tests/train/golden/" + model + ".json", with(overrides, extra));
}

TrainResult train(const std::string& model, const std::string& tag,
                  const std::vector<std::string>& extra, bool alone = false) {
  TrainerOptions options = testing::quiet_options(alone);
  options.simulate_fp8_on_cpu = true;
  return Trainer(recipe_of(model, tag, extra), options).run();
}

// The all-gather bytes of one ZeRO-3 step of `recipe` on this rank, from its sharding plan
// (of its tensor-parallel slices: the tensor-parallel rank is innermost).
int64_t step_gather_bytes(const Recipe& recipe) {
  const std::unique_ptr<models::LanguageModel> model = models::build_model(model_config_of(recipe));
  const int tp = recipe.model.tensor_model_parallel_size;
  PlanningParallelGroup tp_group(tp, testing::world_rank() % tp);
  apply_tensor_parallel(*model, model->vocabulary_tables(), model->layer_table(), tp_group);
  Fp8Plan fp8;
  fp8.bf16_first_blocks = fp8.bf16_last_blocks = 0;
  apply_fp8(*model, model->layer_table(), fp8);
  const FsdpOptions fo = fsdp_options_of(recipe);
  PlanOptions po;
  po.dp_size = testing::world_size() / tp;
  po.block = fo.shard_block;
  po.strategy = fo.strategy;
  const ShardingPlan plan = ShardingPlan::build(
      unit_specs(*model, unit_module_kind(fo.unit_kind), fo.blocks_per_unit, fo.gather_codec.get()),
      po);
  const int64_t element = int64_t(dtype_size(fo.compute_dtype));
  const std::vector<UnitPlan>& units = plan.units();
  // Each block's bytes with its companions' (the units after it up to the next block).
  std::vector<int64_t> blocks;
  for (size_t i = 0; i + 1 < units.size(); ++i) {
    const int64_t bytes = units[i].padded_numel * (units[i].encoded() ? units[i].wire_element_size : element);
    if (units[i].companion())
      blocks.back() += bytes;
    else
      blocks.push_back(bytes);
  }
  int64_t per_micro_batch = units.back().padded_numel * element;  // the root
  for (size_t b = 0; b < blocks.size(); ++b) per_micro_batch += blocks[b] * (b + 1 < blocks.size() ? 2 : 1);
  const int64_t micro_batches =
      recipe.train.global_batch_size / (recipe.train.micro_batch_size * po.dp_size);
  // The gradient norm gathers every unit's block sums of squares (of the reduce dtype, f32
  // unless it is f64) over the shard group.
  const int64_t partial = fo.reduce_dtype == DType::f64 ? 8 : 4;
  int64_t norm = 0;
  if (po.dp_size > 1)
    for (const UnitPlan& u : units) norm += u.padded_numel / po.block * partial;
  return per_micro_batch * micro_batches + norm;
}

void check_same_losses(const TrainResult& got, const TrainResult& reference, const std::string& what) {
  REQUIRE(got.losses.size() == reference.losses.size());
  for (size_t i = 0; i < got.losses.size(); ++i) {
    INFO(what << " step " << i + 1 << ": " << got.losses[i] << " against " << reference.losses[i]);
    CHECK(std::abs(got.losses[i] - reference.losses[i]) <= 1e-12 * reference.losses[i]);
  }
}

TEST_CASE("fp8_param gathers FP8 bytes and gives the losses of bf16 gathers", "[train][fp8][mpi]") {
  if (testing::world_size() != 2) return;
  const std::vector<std::string> tensorwise = {"mixed_precision.fp8=hybrid"};
  const std::vector<std::string> delayed = {"mixed_precision.fp8=hybrid",
                                            "mixed_precision.fp8_recipe=delayed",
                                            "mixed_precision.fp8_amax_history_len=4"};
  for (const std::string model : {"gpt2_tiny", "llama_tiny"})
    for (const auto& [name, fp8] : {std::pair{"tensorwise", tensorwise}, std::pair{"delayed", delayed}}) {
      const std::string what = std::string(model) + " " + name;
      const TrainResult plain = train(model, "p_plain", fp8);
      const std::vector<std::string> param = with(fp8, {"mixed_precision.fp8_param=true"});
      const TrainResult got = train(model, "p_param", param);
      check_same_losses(got, plain, what);
      CHECK(got.fp8.layers.size() == 8);
      // The FP8 units' gathers carry one byte per element: the plan's bytes, fewer than the
      // compute dtype's (f64 here: a block's weights take an eighth). (The tiny units are
      // mostly padding to the shard block, 4096 elements per rank, so the whole step's bytes
      // fall by less than the weights' do.)
      const IssuedCollectives& a = plain.last_step_collectives;
      const IssuedCollectives& b = got.last_step_collectives;
      INFO(what << ": all-gather bytes " << b.all_gather_bytes << " against " << a.all_gather_bytes);
      CHECK(a.all_gather_bytes == step_gather_bytes(recipe_of(model, "p_plan", fp8)));
      CHECK(b.all_gather_bytes == step_gather_bytes(recipe_of(model, "p_plan", param)));
      CHECK(b.all_gather_bytes < a.all_gather_bytes);
      // One all-gather more per block gather (the FP8 unit's), one all-reduce more per step
      // (the weights' amaxes over the shard group).
      // Per rank: 2 micro-batches, each gathering 2 blocks in forward and 1 in backward.
      CHECK(b.all_gathers == a.all_gathers + 2 * 3);
      CHECK(b.all_reduces == a.all_reduces + 1);
      CHECK(b.reduce_scatters == a.reduce_scatters + 2 * 2);  // the FP8 units' gradients
    }
}

// Muon updates the FP8 units' weights like any others (their matrices gathered whole from
// the encoded units' shards); the next step's FP8 gathers carry the new weights.
TEST_CASE("Muon with fp8_param gives the losses of bf16 gathers", "[train][fp8][mpi][muon]") {
  if (testing::world_size() != 2) return;
  const std::vector<std::string> fp8 = {"mixed_precision.fp8=hybrid", "optimizer.optimizer=muon"};
  for (const std::string model : {"gpt2_tiny", "llama_tiny"}) {
    const TrainResult plain = train(model, "muon_plain", fp8);
    const TrainResult got = train(model, "muon_param", with(fp8, {"mixed_precision.fp8_param=true"}));
    check_same_losses(got, plain, model + " with Muon");
  }
}

TEST_CASE("fp8_param under tensor parallelism x ZeRO-3 gives the single-process losses",
          "[train][fp8][mpi]") {
  if (testing::world_size() != 4) return;
  // Each rank gathers FP8 bytes of its tensor-parallel slices, scaled by the whole weight's
  // amax (over the shard group, then over the tensor-parallel group).
  const std::vector<std::string> fp8 = {"mixed_precision.fp8=hybrid"};
  const std::vector<std::string> tp2 = {"model.tensor_model_parallel_size=2"};
  TrainResult reference;
  if (testing::world_rank() == 0) reference = train("gpt2_tiny", "p_tp_alone", fp8, true);
  const TrainResult plain = train("gpt2_tiny", "p_tp_plain", with(fp8, tp2));
  const TrainResult got = train("gpt2_tiny", "p_tp_param",
                                with(fp8, with(tp2, {"mixed_precision.fp8_param=true"})));
  CHECK(got.fp8.layers.size() == 8);
  // The FP8 units' gathers carry one byte per element of the slices. (Padding to the shard
  // block outweighs the halved tiny slices here, so the step's bytes grow.)
  const IssuedCollectives& a = plain.last_step_collectives;
  const IssuedCollectives& b = got.last_step_collectives;
  CHECK(a.all_gather_bytes == step_gather_bytes(recipe_of("gpt2_tiny", "p_plan", with(fp8, tp2))));
  CHECK(b.all_gather_bytes ==
        step_gather_bytes(recipe_of("gpt2_tiny", "p_plan", with(fp8, with(tp2, {"mixed_precision.fp8_param=true"})))));
  CHECK(b.all_gathers == a.all_gathers + 2 * 3);
  // The weights' amaxes: one all-reduce over the shard group, one over the tensor-parallel one.
  CHECK(b.all_reduces == a.all_reduces + 2);
  if (testing::world_rank() == 0) check_same_losses(got, reference, "tp2 x ZeRO-3 fp8_param");
}

TEST_CASE("a run with fp8_param resumes with and without it on the same curve", "[train][fp8][mpi]") {
  if (testing::world_size() != 2) return;
  const std::vector<std::string> fp8 = {"mixed_precision.fp8=hybrid", "mixed_precision.fp8_recipe=delayed"};
  const std::string save = testing::shared_dir("fp8_param_resume", testing::world_rank(), testing::world_size());
  const TrainResult whole = train("gpt2_tiny", "p_whole",
                                  with(fp8, {"mixed_precision.fp8_param=true", "checkpoint.save=" + save,
                                             "checkpoint.save_interval=6"}));
  for (const std::string param : {"true", "false"}) {
    const TrainResult tail = train("gpt2_tiny", "p_tail_" + param,
                                   with(fp8, {"mixed_precision.fp8_param=" + param,
                                              "checkpoint.load=" + save + "/step_000006"}));
    REQUIRE(tail.first_step == 6);
    REQUIRE(tail.losses.size() == size_t(kSteps - 6));
    for (size_t i = 0; i < tail.losses.size(); ++i) {
      INFO("fp8_param=" << param << ", resumed step " << i + 7);
      CHECK(std::abs(tail.losses[i] - whole.losses[i + 6]) <= 1e-12 * whole.losses[i + 6]);
    }
  }
}

TEST_CASE("fp8 with experts: the router stays in bf16 and fp8_param gathers the rest",
          "[train][fp8][mpi]") {
  if (testing::world_size() != 2) return;
  // 16 experts (a router of FP8-sized (16, 32)) and a shared expert: the router's product is
  // the MoE layer's own (not a linear layer's), so it is not an FP8 layer; the attention's
  // and the shared expert's layers are.
  const std::vector<std::string> moe = {
      "model.num_moe_experts=16", "model.moe_router_topk=2", "model.moe_ffn_hidden_size=32",
      "model.moe_shared_expert_intermediate_size=32", "model.moe_aux_loss_coeff=0.01",
      "mixed_precision.fp8=hybrid"};
  const TrainResult plain = train("llama_tiny", "p_moe_plain", moe);
  const TrainResult got = train("llama_tiny", "p_moe_param", with(moe, {"mixed_precision.fp8_param=true"}));
  const std::vector<std::string> layers = {"layers.0.attn.qkv", "layers.0.attn.proj",
                                           "layers.0.mlp.shared_expert.gate_up",
                                           "layers.0.mlp.shared_expert.proj"};
  REQUIRE(got.fp8.layers.size() == 8);
  CHECK(std::vector<std::string>(got.fp8.layers.begin(), got.fp8.layers.begin() + 4) == layers);
  check_same_losses(got, plain, "llama MoE fp8_param");
}

TEST_CASE("fp8_param is refused where it cannot gather FP8 weights, naming the key", "[train][fp8]") {
  if (testing::world_size() != 1) return;
  auto refused = [](const std::vector<std::string>& extra, const std::string& message) {
    INFO(message);
    CHECK_THROWS_WITH(recipe_of("gpt2_tiny", "p_refused", extra), Catch::Matchers::Contains(message));
  };
  refused({"mixed_precision.fp8_param=true"}, "'mixed_precision.fp8' is null");
  refused({"mixed_precision.fp8=e4m3", "mixed_precision.fp8_param=true",
           "ddp.data_parallel_sharding_strategy=optim"},
          "'ddp.data_parallel_sharding_strategy' is \"optim\"");
  refused({"mixed_precision.fp8=e4m3", "mixed_precision.fp8_param=true", "model.seq_length=30",
           "train.micro_batch_size=1"},
          "not a multiple of 16");
}

}  // namespace
}  // namespace fsdp::train
