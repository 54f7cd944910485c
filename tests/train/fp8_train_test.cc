// FP8 training (mixed_precision.fp8) in the trainer, on the CPU's simulation of FP8 (the
// GPU's bytes and scales; products in f64): a tiny GPT-2 and a tiny Llama train with their
// blocks' linear layers in FP8 (e4m3 and hybrid), close to their bf16-free runs but not
// equal to them (the quantization is really applied); under mpirun -np 2 ZeRO-1 and ZeRO-3
// with gradient accumulation give the single-process FP8 losses within 1e-12 (every rank
// quantizes the whole gathered weight and its own micro-batches, as one process does).
// Delayed scaling: its first step is tensorwise's, evaluations leave it alone, it resumes
// bit for bit, and ZeRO-3 and context parallelism give the single-process losses. Block
// scaling: close to the unquantized curve (and not tensorwise's), bf16 where sizes are not
// multiples of 128, and ZeRO-3 gives the single-process losses. Tensor parallelism (TP2,
// TP2+SP, TP2 x CP2) gives the single-process FP8 losses for the three recipes; a qkv layer
// with replicated key/value heads stays in bf16. Row scaling: close to the unquantized
// curve (and not tensorwise's), and ZeRO-3, CP2, TP2, TP2+SP and TP2 x CP2 give the
// single-process losses.
// And the refusals: fp8 on a CPU run, an unknown recipe, fp8_param with blockwise or
// rowwise or outside ZeRO-3.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/data/llmc_shards.h"
#include "runtime/train/recipe.h"
#include "runtime/train/trainer.h"
#include "tests/test_support.h"
#include "tests/train/short_run.h"

namespace fsdp::train {
namespace {

using testing::with;

constexpr int kSteps = 30;

Recipe recipe_of(const std::string& model, const std::string& tag,
                 const std::vector<std::string>& extra) {
  // Both blocks of the tiny models in FP8 (the default keeps the first and last in bf16).
  const std::vector<std::string> overrides = with(testing::short_run("fp8", tag, kSteps),
                                                  {"mixed_precision.first_last_layers_bf16=false"});
  return load_recipe("tests/train/golden/" + model + ".json", with(overrides, extra));
}

TrainResult train(const std::string& model, const std::string& tag,
                  const std::vector<std::string>& extra, bool alone = false) {
  TrainerOptions options = testing::quiet_options(alone);
  options.simulate_fp8_on_cpu = true;
  return Trainer(recipe_of(model, tag, extra), options).run();
}

double mean_of_last(const std::vector<double>& v, size_t n) {
  double s = 0;
  for (size_t i = v.size() - n; i < v.size(); ++i) s += v[i] / double(n);
  return s;
}

// `extra`: overrides both runs take (blockwise: sizes that are multiples of 128).
TrainResult check_close_to_unquantized(const std::string& model, const std::string& fp8,
                                       const std::vector<std::string>& extra = {},
                                       const std::string& tag = "") {
  std::vector<std::string> quantized = extra;
  quantized.push_back("mixed_precision.fp8=" + fp8);
  const TrainResult plain = train(model, model + tag + "_plain", extra, true);
  const TrainResult q = train(model, model + tag + "_" + fp8, quantized, true);
  REQUIRE(q.losses.size() == size_t(kSteps));
  REQUIRE(plain.losses.size() == size_t(kSteps));
  INFO(model << " " << fp8 << ": last losses " << q.losses.back() << " against "
             << plain.losses.back());
  // The products are really quantized: the first step's loss already differs.
  CHECK(q.losses[0] != plain.losses[0]);
  // Both blocks' four linear layers (qkv, attention proj, fc or gate_up, MLP proj).
  CHECK(q.fp8.layers.size() == 8);
  CHECK(q.fp8.bf16_blocks.empty());
  CHECK(plain.fp8.layers.empty());
  // ... and the model learns as the unquantized one does: the mean of the last 5 losses
  // within 0.05 of it (its fall from ln 256 = 5.55 is about 2), every loss finite.
  for (double l : q.losses) CHECK(std::isfinite(l));
  CHECK(mean_of_last(q.losses, 5) < q.losses[0] - 1.0);
  CHECK(std::abs(mean_of_last(q.losses, 5) - mean_of_last(plain.losses, 5)) < 0.05);
  return q;
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
  CHECK(r.fp8.layers.empty());
  CHECK(r.fp8.bf16_blocks == std::vector<std::string>{"h.0", "h.1"});
}

TEST_CASE("fp8 gives the single-process losses under ZeRO-1, ZeRO-3 and context parallelism",
          "[train][fp8][mpi]") {
  if (testing::world_size() != 2) return;
  {
    // Each rank holds half of every sequence: current amaxes are taken over both halves.
    TrainResult reference;
    if (testing::world_rank() == 0)
      reference = train("gpt2_tiny", "fp8_cp_alone", {"mixed_precision.fp8=hybrid"}, true);
    const TrainResult got = train("gpt2_tiny", "fp8_cp2",
                                  {"mixed_precision.fp8=hybrid", "model.context_parallel_size=2"});
    REQUIRE(got.losses.size() == size_t(kSteps));
    if (testing::world_rank() == 0)
      for (size_t i = 0; i < got.losses.size(); ++i) {
        INFO("cp2 step " << i + 1 << ": " << got.losses[i] << " against " << reference.losses[i]);
        CHECK(std::abs(got.losses[i] - reference.losses[i]) <= 1e-12 * reference.losses[i]);
      }
  }
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

// ---- block scaling (fp8_recipe "blockwise")

// The tiny models widened so that every size of the blocks' linear layers, tokens of a
// micro-batch included (4 x 32), is a multiple of 128 ...
const std::vector<std::string> kBlockSizes = {"model.d_model=128", "model.d_ff=256"};
// ... and with micro-batches of 2 sequences (ZeRO-3 with accumulation), of 64 tokens each.
const std::vector<std::string> kBlockSizesMicro2 = {"model.d_model=128", "model.seq_length=64",
                                                    "train.micro_batch_size=2"};

TEST_CASE("blockwise fp8 training follows the unquantized curve on the CPU simulation",
          "[train][fp8]") {
  if (testing::world_size() != 1) return;
  const std::vector<std::string> blockwise =
      with(kBlockSizes, {"mixed_precision.fp8_recipe=blockwise"});
  const TrainResult gpt2 = check_close_to_unquantized("gpt2_tiny", "hybrid", blockwise, "_block");
  check_close_to_unquantized("llama_tiny", "e4m3", blockwise, "_block");
  // Blocks, not one scale per tensor: the tensorwise run of the same model differs from
  // the first step (whose loss the later steps' schedule does not touch).
  const TrainResult tensorwise =
      train("gpt2_tiny", "gpt2_tiny_block_tw",
            with(kBlockSizes, {"mixed_precision.fp8=hybrid", "train.train_iters=1"}), true);
  REQUIRE(tensorwise.losses.size() == 1);
  CHECK(tensorwise.losses[0] != gpt2.losses[0]);
}

TEST_CASE("blockwise fp8 keeps layers whose sizes are not multiples of 128 in bf16",
          "[train][fp8]") {
  if (testing::world_size() != 1) return;
  // d_model 32: every layer is marked, none fits 128-wide blocks, so every product runs
  // unquantized and the losses are the unquantized run's, bit for bit.
  const std::vector<std::string> short_run = {"train.train_iters=3"};
  const TrainResult plain = train("gpt2_tiny", "block_small_plain", short_run, true);
  const TrainResult q = train("gpt2_tiny", "block_small",
                              with(short_run, {"mixed_precision.fp8=e4m3",
                                               "mixed_precision.fp8_recipe=blockwise"}),
                              true);
  CHECK(q.fp8.layers.size() == 8);
  CHECK(q.losses == plain.losses);
}

TEST_CASE("blockwise fp8 gives the single-process losses under ZeRO-3", "[train][fp8][mpi]") {
  if (testing::world_size() != 2) return;
  // Every block lies inside one micro-batch's tokens or one weight: each rank quantizes its
  // own micro-batches and the whole gathered weight, as the single process does.
  const std::vector<std::string> extra =
      with(kBlockSizesMicro2, {"mixed_precision.fp8=hybrid", "mixed_precision.fp8_recipe=blockwise"});
  TrainResult reference;
  if (testing::world_rank() == 0) reference = train("gpt2_tiny", "block_alone", extra, true);
  const TrainResult got = train(
      "gpt2_tiny", "block_zero3", with(extra, {"ddp.data_parallel_sharding_strategy=optim_grads_params"}));
  REQUIRE(got.losses.size() == size_t(kSteps));
  if (testing::world_rank() != 0) return;
  CHECK(got.fp8.layers.size() == 8);
  for (size_t i = 0; i < got.losses.size(); ++i) {
    INFO("ZeRO-3 step " << i + 1 << ": " << got.losses[i] << " against " << reference.losses[i]);
    CHECK(std::abs(got.losses[i] - reference.losses[i]) <= 1e-12 * reference.losses[i]);
  }
}

// ---- delayed scaling (fp8_recipe "delayed")

const std::vector<std::string> kDelayed = {"mixed_precision.fp8=hybrid",
                                           "mixed_precision.fp8_recipe=delayed"};

std::string shared_dir(const std::string& name) {
  return testing::shared_dir(name, testing::world_rank(), testing::world_size());
}

TEST_CASE("delayed scaling: the first step as tensorwise, then from the amax history",
          "[train][fp8]") {
  if (testing::world_size() != 1) return;
  const TrainResult plain = train("gpt2_tiny", "dl_plain", {}, true);
  const TrainResult tensorwise = train("gpt2_tiny", "dl_tensorwise", {"mixed_precision.fp8=hybrid"}, true);
  const TrainResult delayed = train("gpt2_tiny", "dl_delayed", kDelayed, true);
  REQUIRE(delayed.losses.size() == size_t(kSteps));
  CHECK(delayed.fp8.layers.size() == 8);
  // Nothing in the history yet: the first step quantizes each operand by its own amax.
  CHECK(delayed.losses[0] == tensorwise.losses[0]);
  // From the second on, by the first step's amaxes: other bytes, other losses.
  CHECK(delayed.losses[1] != tensorwise.losses[1]);
  for (double l : delayed.losses) CHECK(std::isfinite(l));
  CHECK(mean_of_last(delayed.losses, 5) < delayed.losses[0] - 1.0);
  CHECK(std::abs(mean_of_last(delayed.losses, 5) - mean_of_last(plain.losses, 5)) < 0.05);
  // A longer history scaled by its maximum, with a margin: another run, as good.
  const TrainResult max8 = train("gpt2_tiny", "dl_max8",
                                 with(kDelayed, {"mixed_precision.fp8_amax_history_len=8",
                                                 "mixed_precision.fp8_amax_compute_algo=max",
                                                 "mixed_precision.fp8_margin=1"}),
                                 true);
  CHECK(max8.losses[0] == tensorwise.losses[0]);
  CHECK(max8.losses[2] != delayed.losses[2]);
  CHECK(std::abs(mean_of_last(max8.losses, 5) - mean_of_last(plain.losses, 5)) < 0.05);
}

TEST_CASE("evaluations leave delayed scaling's amaxes alone", "[train][fp8]") {
  if (testing::world_size() != 1) return;
  // Evaluation forwards quantize too (recording amaxes); the next step starts afresh.
  const TrainResult quiet = train("gpt2_tiny", "dl_quiet", kDelayed, true);
  const TrainResult evaluated =
      train("gpt2_tiny", "dl_evaluated", with(kDelayed, {"train.eval_interval=3"}), true);
  REQUIRE(evaluated.losses.size() == quiet.losses.size());
  CHECK(!evaluated.val_losses.empty());
  for (size_t i = 0; i < quiet.losses.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(evaluated.losses[i] == quiet.losses[i]);
  }
}

TEST_CASE("delayed scaling resumes bit for bit; a tensorwise checkpoint starts a history",
          "[train][fp8]") {
  if (testing::world_size() != 1) return;
  const std::string save = shared_dir("dl_resume");
  const TrainResult whole = train("gpt2_tiny", "dl_whole",
                                  with(kDelayed, {"checkpoint.save=" + save, "checkpoint.save_interval=15"}), true);
  const TrainResult tail = train("gpt2_tiny", "dl_tail",
                                 with(kDelayed, {"checkpoint.load=" + save + "/step_000015"}), true);
  REQUIRE(tail.first_step == 15);
  REQUIRE(tail.losses.size() == size_t(kSteps - 15));
  for (size_t i = 0; i < tail.losses.size(); ++i) {
    INFO("step " << i + 16);
    CHECK(tail.losses[i] == whole.losses[i + 15]);
  }
  // A checkpoint of a tensorwise run holds no histories: the resumed run's first step scales
  // tensor-wise (the tensorwise run's own next loss), its second from that step's amaxes.
  const std::string tw_save = shared_dir("dl_tensorwise_resume");
  const TrainResult tw = train("gpt2_tiny", "dl_tw_whole",
                               {"mixed_precision.fp8=hybrid", "checkpoint.save=" + tw_save,
                                "checkpoint.save_interval=15"}, true);
  const TrainResult switched = train("gpt2_tiny", "dl_switched",
                                     with(kDelayed, {"checkpoint.load=" + tw_save + "/step_000015"}), true);
  REQUIRE(switched.losses.size() == size_t(kSteps - 15));
  CHECK(switched.losses[0] == tw.losses[15]);
  CHECK(switched.losses[1] != tw.losses[16]);
  // A delayed checkpoint without the classifier's history, resumed with the classifier in
  // FP8: every history starts afresh (none scales by an empty one), so the first step is
  // the tensorwise step from the same checkpoint.
  const std::vector<std::string> head = {"mixed_precision.fp8_classifier=true",
                                         "checkpoint.load=" + save + "/step_000015"};
  const TrainResult head_delayed = train("gpt2_tiny", "dl_head", with(kDelayed, head), true);
  const TrainResult head_tensorwise =
      train("gpt2_tiny", "dl_head_tw", with({"mixed_precision.fp8=hybrid"}, head), true);
  REQUIRE(head_delayed.losses.size() == size_t(kSteps - 15));
  CHECK(head_delayed.losses[0] == head_tensorwise.losses[0]);
  CHECK(head_delayed.losses[1] != head_tensorwise.losses[1]);
  // A history of another length does not fit; the error names the key.
  CHECK_THROWS_WITH(train("gpt2_tiny", "dl_other_len",
                          with(kDelayed, {"checkpoint.load=" + save + "/step_000015",
                                          "mixed_precision.fp8_amax_history_len=4"}), true),
                    Catch::Matchers::Contains("mixed_precision.fp8_amax_history_len"));
}

TEST_CASE("delayed scaling gives the single-process losses under ZeRO-3 and context parallelism",
          "[train][fp8][mpi]") {
  if (testing::world_size() != 2) return;
  // Amaxes are taken over every micro-batch of every rank: the single process's.
  // Each layout, and what the single process runs alike (the micro-batch size is part of
  // the objective; context parallelism needs its ranks).
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> layouts = {
      {{"ddp.data_parallel_sharding_strategy=optim_grads_params", "train.micro_batch_size=2"},
       {"train.micro_batch_size=2"}},
      {{"model.context_parallel_size=2"}, {}}};
  for (const auto& [layout, alone] : layouts) {
    TrainResult reference;
    if (testing::world_rank() == 0) reference = train("gpt2_tiny", "dl_alone", with(kDelayed, alone), true);
    const TrainResult got = train("gpt2_tiny", "dl_np2", with(kDelayed, layout));
    REQUIRE(got.losses.size() == size_t(kSteps));
    if (testing::world_rank() != 0) continue;
    for (size_t i = 0; i < got.losses.size(); ++i) {
      INFO(layout[0] << " step " << i + 1 << ": " << got.losses[i] << " against " << reference.losses[i]);
      CHECK(std::abs(got.losses[i] - reference.losses[i]) <= 1e-12 * reference.losses[i]);
    }
  }
  // Saved under ZeRO-3, resumed under ZeRO-1: the same curve.
  const std::string save = shared_dir("dl_zero3");
  const TrainResult whole = train("gpt2_tiny", "dl_zero3_whole",
                                  with(kDelayed, {"ddp.data_parallel_sharding_strategy=optim_grads_params",
                                                  "checkpoint.save=" + save, "checkpoint.save_interval=15"}));
  const TrainResult tail = train("gpt2_tiny", "dl_zero1_tail",
                                 with(kDelayed, {"ddp.data_parallel_sharding_strategy=optim",
                                                 "checkpoint.load=" + save + "/step_000015"}));
  REQUIRE(tail.losses.size() == size_t(kSteps - 15));
  for (size_t i = 0; i < tail.losses.size(); ++i) {
    INFO("resumed step " << i + 16);
    CHECK(std::abs(tail.losses[i] - whole.losses[i + 15]) <= 1e-12 * whole.losses[i + 15]);
  }
}

// ---- tensor parallelism

// Runs `layout` (on every rank) and, on rank 0 alone, the single process with `extra`;
// checks on rank 0 that their losses agree within 1e-12 relative at every step and returns
// the layout's.
TrainResult check_single_process_losses(const std::string& model, const std::vector<std::string>& extra,
                                        const std::vector<std::string>& layout) {
  TrainResult reference;
  if (testing::world_rank() == 0) reference = train(model, "tp_alone", extra, true);
  const TrainResult got = train(model, "tp_layout", with(extra, layout));
  REQUIRE(got.losses.size() > 1);
  if (testing::world_rank() == 0) REQUIRE(got.losses.size() == reference.losses.size());
  if (testing::world_rank() == 0)
    for (size_t i = 0; i < got.losses.size(); ++i) {
      INFO(model << " " << layout.back() << " step " << i + 1 << ": " << got.losses[i] << " against "
                 << reference.losses[i]);
      CHECK(std::abs(got.losses[i] - reference.losses[i]) <= 1e-12 * reference.losses[i]);
    }
  return got;
}

TEST_CASE("fp8 tensor-parallel layers give the single-process losses", "[train][fp8][mpi]") {
  if (testing::world_size() != 2) return;
  // Column- and row-parallel layers run in FP8 with the amaxes of the whole operands (taken
  // over the tensor-parallel ranks for the weights and for the split inputs and output
  // gradients); two micro-batches per step.
  const std::vector<std::string> tp2 = {"model.tensor_model_parallel_size=2"};
  const std::vector<std::string> tp2_sp = {"model.tensor_model_parallel_size=2",
                                           "model.sequence_parallel=true"};
  for (const std::string model : {"gpt2_tiny", "llama_tiny"})
    for (const auto& layout : {tp2, tp2_sp}) {
      const TrainResult got = check_single_process_losses(model, {"mixed_precision.fp8=hybrid"}, layout);
      CHECK(got.fp8.layers.size() == 8);  // qkv and fc (column), both projections (row)
      CHECK(got.fp8.bf16_layers.empty());
    }
  // Delayed scaling: its first step as tensorwise's, then the amaxes of every rank.
  check_single_process_losses("llama_tiny", kDelayed, tp2_sp);
  // Block scaling: each rank's slices are whole 128-wide blocks of the single process's
  // (8 steps: the widened model is the slowest here).
  check_single_process_losses("gpt2_tiny",
                              {"mixed_precision.fp8=hybrid", "mixed_precision.fp8_recipe=blockwise",
                               "model.d_model=256", "train.train_iters=8"},
                              tp2_sp);
}

TEST_CASE("fp8 under tensor x context parallelism gives the single-process losses; replicated "
          "key/value heads keep their layer in bf16",
          "[train][fp8][mpi]") {
  if (testing::world_size() != 4) return;
  // Amaxes over the context-parallel ranks (tokens) and the tensor-parallel ones (features).
  check_single_process_losses("gpt2_tiny", {"mixed_precision.fp8=hybrid"},
                              {"model.tensor_model_parallel_size=2", "model.context_parallel_size=2"});
  // Llama's 2 key/value heads on 4 tensor-parallel ranks: each is replicated on two, whose
  // parts of its gradient are summed after the product, so their layer stays in bf16.
  const TrainResult r = train("llama_tiny", "tp4_kv", {"mixed_precision.fp8=hybrid",
                                                       "model.tensor_model_parallel_size=4",
                                                       "train.train_iters=2"});
  CHECK(r.fp8.layers.size() == 6);
  CHECK(r.fp8.bf16_layers ==
        std::vector<std::string>{"layers.0.attn.qkv (replicated key/value heads)",
                                 "layers.1.attn.qkv (replicated key/value heads)"});
  for (double l : r.losses) CHECK(std::isfinite(l));
}

TEST_CASE("blockwise fp8 under context parallelism gives the single-process losses when its "
          "chunks are whole blocks",
          "[train][fp8][mpi]") {
  if (testing::world_size() != 2) return;
  // 512-token sequences on 2 context-parallel ranks: chunks of 128 tokens, so every 1x128
  // block along the tokens (the weight gradient's K) holds the tokens the single process's
  // block holds, and the blocks along the features are each token's own.
  check_single_process_losses(
      "gpt2_tiny",
      {"mixed_precision.fp8=hybrid", "mixed_precision.fp8_recipe=blockwise", "model.d_model=128",
       "model.seq_length=512", "train.micro_batch_size=1", "train.global_batch_size=2",
       "train.train_iters=6"},
      {"model.context_parallel_size=2"});
}

// ---- row scaling (fp8_recipe "rowwise")

const std::vector<std::string> kRowwise = {"mixed_precision.fp8=hybrid",
                                           "mixed_precision.fp8_recipe=rowwise"};

// Selective recompute gives the losses of the activation kept, under every recipe, in a
// model that mixes both kinds of MLP: three blocks, the first and last in bf16 (their
// activation recomputed under selective), the middle one in FP8 (its proj's FP8 copy kept
// either way, SwiGLU computed inside proj's cast; GELU's and SwiGLU's gradients inside fc's
// output gradient cast; the block and row recipes compute those values first).
TEST_CASE("fp8 with the MLP activation recomputed gives the same losses", "[train][fp8]") {
  if (testing::world_size() != 1) return;
  // 8 steps of the 30: a recomputed activation that differs changes the second step's loss,
  // and delayed scaling's amax history (which a recompute must not update twice) steers
  // every step from the second on.
  constexpr int kRecomputeSteps = 8;
  for (const std::string model : {"gpt2_tiny", "llama_tiny"})
    for (const std::string recipe : {"tensorwise", "delayed", "blockwise", "rowwise"}) {
      std::vector<std::string> o = {"mixed_precision.fp8=hybrid", "mixed_precision.fp8_recipe=" + recipe,
                                    "train.train_iters=" + std::to_string(kRecomputeSteps),
                                    "model.n_layer=3", "mixed_precision.first_last_layers_bf16=true"};
      if (recipe == "blockwise") o = with(o, kBlockSizes);
      const TrainResult kept = train(model, "act_kept", o, true);
      const TrainResult recomputed =
          train(model, "act_recomputed", with(o, {"model.activation_recompute=selective"}), true);
      INFO(model << " " << recipe);
      REQUIRE(kept.losses.size() == size_t(kRecomputeSteps));
      CHECK(kept.fp8.layers.size() == 4);
      CHECK(kept.fp8.bf16_blocks.size() == 2);
      CHECK(recomputed.losses == kept.losses);
    }
}

// Where the weights stay whole between updates (no_shard, ZeRO-1, ZeRO-2), each FP8 weight
// is cast once per step, both layouts, and read by every product of the step's two
// micro-batches; ZeRO-3 casts it at each product. On one rank the two give the same losses
// under every recipe: a cast kept past an update (stale weights) or past an evaluation
// (whose cast would skip the step's amax record under delayed scaling) would change them.
TEST_CASE("fp8 weights cast once per step give the losses of a cast per product", "[train][fp8]") {
  if (testing::world_size() != 1) return;
  constexpr int kCacheSteps = 8;
  for (const std::string recipe : {"tensorwise", "delayed", "blockwise", "rowwise"}) {
    std::vector<std::string> o = {"mixed_precision.fp8=hybrid", "mixed_precision.fp8_recipe=" + recipe,
                                  "train.train_iters=" + std::to_string(kCacheSteps),
                                  "train.eval_interval=3"};
    if (recipe == "blockwise") o = with(o, kBlockSizes);
    const TrainResult cached = train("llama_tiny", "cast_once", o, true);
    const TrainResult per_product = train(
        "llama_tiny", "cast_each",
        with(o, {"ddp.data_parallel_sharding_strategy=optim_grads_params"}), true);
    INFO(recipe);
    REQUIRE(cached.losses.size() == size_t(kCacheSteps));
    REQUIRE(per_product.losses.size() == size_t(kCacheSteps));
    CHECK(cached.fp8.layers.size() == 8);
    CHECK(!cached.val_losses.empty());
    for (size_t i = 0; i < cached.losses.size(); ++i) {
      INFO("step " << i + 1);
      CHECK(cached.losses[i] == per_product.losses[i]);
    }
    // Evaluation losses: within 1e-12, since they differ in the last bits between no_shard
    // and ZeRO-3 without FP8 too (an unquantized run of this recipe shows it); a stale
    // cast would move them by far more.
    REQUIRE(cached.val_losses.size() == per_product.val_losses.size());
    for (size_t i = 0; i < cached.val_losses.size(); ++i)
      CHECK(std::abs(cached.val_losses[i] - per_product.val_losses[i]) < 1e-12);
  }
}

// mixed_precision.fp8_classifier: the output head's products in FP8 too (GPT-2's head is
// its token embedding, tied; the Llama's its own), close to the unquantized curve and not
// the curve of FP8 blocks alone.
TEST_CASE("the classifier in FP8 follows the unquantized curve on the CPU simulation", "[train][fp8]") {
  if (testing::world_size() != 1) return;
  // The unquantized runs, one per model and width (the block recipe's is widened).
  std::map<std::string, TrainResult> plain_runs;
  auto plain_of = [&](const std::string& model, bool widened) -> const TrainResult& {
    const std::string key = model + (widened ? "_wide" : "");
    if (!plain_runs.count(key))
      plain_runs[key] = train(model, "cls_plain", widened ? kBlockSizes : std::vector<std::string>{}, true);
    return plain_runs[key];
  };
  for (const std::string recipe : {"tensorwise", "delayed", "blockwise", "rowwise"})
    for (const auto& [model, head] : {std::pair<std::string, std::string>{"gpt2_tiny", "wte"},
                                      {"llama_tiny", "lm_head"}}) {
      // The block and row recipes on the untied head only (the widened blockwise model is
      // this file's slowest run).
      if ((recipe == "blockwise" || recipe == "rowwise") && model == "gpt2_tiny") continue;
      std::vector<std::string> blocks = {"mixed_precision.fp8=hybrid",
                                         "mixed_precision.fp8_recipe=" + recipe};
      if (recipe == "blockwise") blocks = with(blocks, kBlockSizes);
      const TrainResult& plain = plain_of(model, recipe == "blockwise");
      const TrainResult fp8_blocks = train(model, "cls_blocks", blocks, true);
      const TrainResult q = train(model, "cls_fp8", with(blocks, {"mixed_precision.fp8_classifier=true"}), true);
      INFO(model << " " << recipe << ": last losses " << q.losses.back() << " against "
                 << plain.losses.back());
      REQUIRE(q.losses.size() == size_t(kSteps));
      CHECK(q.fp8.layers.size() == 9);
      CHECK(q.fp8.layers.back() == head);
      CHECK(q.fp8.classifier == head);
      CHECK(fp8_blocks.fp8.classifier.empty());
      // The head is really quantized: the first step's loss already differs.
      CHECK(q.losses[0] != fp8_blocks.losses[0]);
      for (double l : q.losses) CHECK(std::isfinite(l));
      CHECK(mean_of_last(q.losses, 5) < q.losses[0] - 1.0);
      CHECK(std::abs(mean_of_last(q.losses, 5) - mean_of_last(plain.losses, 5)) < 0.05);
    }
  // Refused without FP8 blocks, naming the key.
  CHECK_THROWS_WITH(train("gpt2_tiny", "cls_alone", {"mixed_precision.fp8_classifier=true"}, true),
                    Catch::Matchers::Contains("mixed_precision.fp8_classifier"));
}

TEST_CASE("the classifier in FP8 gives the single-process losses under ZeRO-3 and context "
          "parallelism; a vocabulary-parallel head stays in bf16",
          "[train][fp8][mpi]") {
  if (testing::world_size() != 2) return;
  const std::vector<std::string> head = with(kDelayed, {"mixed_precision.fp8_classifier=true"});
  // Its amaxes over every micro-batch of every rank (delayed), its current amaxes over the
  // context-parallel ranks' tokens (tensorwise).
  check_single_process_losses("llama_tiny", with(head, {"train.micro_batch_size=2"}),
                              {"ddp.data_parallel_sharding_strategy=optim_grads_params"});
  check_single_process_losses("gpt2_tiny",
                              {"mixed_precision.fp8=hybrid", "mixed_precision.fp8_classifier=true"},
                              {"model.context_parallel_size=2"});
  // Tensor parallelism splits the Llama's head over the vocabulary: bf16, as without the key.
  const TrainResult tp = check_single_process_losses(
      "llama_tiny", kDelayed, {"model.tensor_model_parallel_size=2", "mixed_precision.fp8_classifier=true"});
  CHECK(tp.fp8.classifier.empty());
  CHECK(tp.fp8.bf16_layers == std::vector<std::string>{"lm_head (vocabulary-parallel)"});
}

TEST_CASE("rowwise fp8 training follows the unquantized curve on the CPU simulation",
          "[train][fp8]") {
  if (testing::world_size() != 1) return;
  const TrainResult rowwise =
      check_close_to_unquantized("gpt2_tiny", "hybrid", {"mixed_precision.fp8_recipe=rowwise"}, "_rw");
  // Its own scales: not tensorwise's numbers.
  const TrainResult tensorwise = train("gpt2_tiny", "rw_tensorwise", {"mixed_precision.fp8=hybrid"}, true);
  CHECK(rowwise.losses[0] != tensorwise.losses[0]);
  check_close_to_unquantized("llama_tiny", "e4m3", {"mixed_precision.fp8_recipe=rowwise"}, "_rw");
}

TEST_CASE("rowwise fp8 gives the single-process losses under ZeRO-3, context and tensor "
          "parallelism",
          "[train][fp8][mpi]") {
  if (testing::world_size() != 2) return;
  // A row's amax over the ranks holding the rest of the row (row-parallel inputs, column-
  // parallel output gradients, row-parallel weights), a column's over those holding the
  // rest of the column (the other tokens under context parallelism, column-parallel weights).
  check_single_process_losses("gpt2_tiny", with(kRowwise, {"train.micro_batch_size=2"}),
                              {"ddp.data_parallel_sharding_strategy=optim_grads_params"});
  check_single_process_losses("gpt2_tiny", kRowwise, {"model.context_parallel_size=2"});
  check_single_process_losses("llama_tiny", kRowwise,
                              {"model.tensor_model_parallel_size=2", "model.sequence_parallel=true"});
  check_single_process_losses("gpt2_tiny", kRowwise, {"model.tensor_model_parallel_size=2"});
}

TEST_CASE("rowwise fp8 under tensor x context parallelism gives the single-process losses",
          "[train][fp8][mpi]") {
  if (testing::world_size() != 4) return;
  check_single_process_losses("llama_tiny", kRowwise,
                              {"model.tensor_model_parallel_size=2", "model.context_parallel_size=2"});
}

TEST_CASE("fp8 is refused where it cannot run, naming the key", "[train][fp8]") {
  if (testing::world_size() != 1) return;
  const TrainerOptions options = testing::quiet_options();
  CHECK_THROWS_WITH(Trainer(recipe_of("gpt2_tiny", "fp8_cpu", {"mixed_precision.fp8=e4m3"}), options),
                    Catch::Matchers::Contains("'mixed_precision.fp8' \"e4m3\" needs a GPU"));
  CHECK_THROWS_WITH(recipe_of("gpt2_tiny", "fp8_fourwise",
                              {"mixed_precision.fp8=e4m3", "mixed_precision.fp8_recipe=fourwise"}),
                    Catch::Matchers::Contains("mixed_precision.fp8_recipe"));
  CHECK_THROWS_WITH(recipe_of("gpt2_tiny", "fp8_rowwise_param",
                              {"mixed_precision.fp8=e4m3", "mixed_precision.fp8_recipe=rowwise",
                               "mixed_precision.fp8_param=true",
                               "ddp.data_parallel_sharding_strategy=optim_grads_params"}),
                    Catch::Matchers::Contains("'mixed_precision.fp8_param' with "
                                              "'mixed_precision.fp8_recipe' \"rowwise\""));
  CHECK_NOTHROW(recipe_of("gpt2_tiny", "fp8_blockwise",
                          {"mixed_precision.fp8=e4m3", "mixed_precision.fp8_recipe=blockwise"}));
  CHECK_THROWS_WITH(recipe_of("gpt2_tiny", "fp8_blockwise_param",
                              {"mixed_precision.fp8=e4m3", "mixed_precision.fp8_recipe=blockwise",
                               "mixed_precision.fp8_param=true",
                               "ddp.data_parallel_sharding_strategy=optim_grads_params"}),
                    Catch::Matchers::Contains("'mixed_precision.fp8_param' with "
                                              "'mixed_precision.fp8_recipe' \"blockwise\""));
  CHECK_THROWS_WITH(recipe_of("gpt2_tiny", "fp8_graphs",
                              {"mixed_precision.fp8=e4m3", "mixed_precision.fp8_recipe=delayed",
                               "train.cuda_graphs=true", "dist.device=cuda"}),
                    Catch::Matchers::Contains("'train.cuda_graphs' with 'mixed_precision.fp8_recipe'"));
  CHECK_THROWS_WITH(recipe_of("gpt2_tiny", "fp8_param",
                              {"mixed_precision.fp8=e4m3", "mixed_precision.fp8_param=true"}),
                    Catch::Matchers::Contains("'mixed_precision.fp8_param'"));
  CHECK_THROWS_WITH(recipe_of("gpt2_tiny", "fp8_bad", {"mixed_precision.fp8=e3m4"}),
                    Catch::Matchers::Contains("mixed_precision.fp8"));
}

}  // namespace
}  // namespace fsdp::train
