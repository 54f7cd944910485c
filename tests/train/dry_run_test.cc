// The dry run and the trainer's memory estimate under FP8: the dry run applies the recipe's
// FP8 plan as the trainer does (it names the FP8 layers and prices fp8_param's FP8 units),
// and the activation estimate counts the FP8 copies the layers keep instead of their inputs.
#include <string>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/train/dry_run.h"
#include "runtime/train/memory_prediction.h"
#include "runtime/train/metrics_line.h"
#include "runtime/train/recipe.h"
#include "runtime/train/trainer_setup.h"
#include "tests/test_support.h"

namespace fsdp::train {
namespace {

using Catch::Matchers::Contains;

TEST_CASE("the dry run applies the FP8 plan: its layers and FP8 units", "[train][fp8]") {
  // GPT 1.3B under ZeRO-3 on 2 GPUs: 24 blocks, the first and last in bf16.
  const Recipe plain = load_recipe("configs/gpt-1.3b.json");
  const Recipe fp8 = load_recipe("configs/gpt-1.3b.json",
                                 {"mixed_precision.fp8=hybrid", "mixed_precision.fp8_param=true"});
  const std::string with_fp8 = dry_run_report(fp8, 2, true);
  INFO(with_fp8);
  CHECK_THAT(with_fp8, Contains("fp8: hybrid tensorwise in 88 linear layers of the blocks"));
  CHECK_THAT(with_fp8, Contains("blocks h.0, h.23"));
  CHECK_THAT(with_fp8, Contains("weights gathered in FP8"));
  // Each FP8 block's weights form a unit gathered in FP8 after the block's own.
  CHECK_THAT(with_fp8, Contains("h.1.fp8"));
  CHECK_THAT(with_fp8, !Contains("h.0.fp8"));
  // ZeRO-3 casts the weights at each product: no casts held.
  CHECK_THAT(with_fp8, !Contains("fp8 weight casts"));
  const std::string without = dry_run_report(plain, 2, true);
  CHECK_THAT(without, !Contains("linear layers of the blocks"));
  CHECK_THAT(without, !Contains("h.1.fp8"));
}

TEST_CASE("the dry run counts the FP8 weight casts held for a step where weights stay whole",
          "[train][fp8]") {
  // no_shard: each FP8 weight cast once per step, both layouts (one byte each) held for it.
  // The 88 FP8 layers of GPT 1.3B's 22 middle blocks: qkv 3C x C, proj C x C, fc 4C x C,
  // MLP proj C x 4C.
  const Recipe r = load_recipe("configs/gpt-1.3b.json",
                               {"mixed_precision.fp8=hybrid",
                                "ddp.data_parallel_sharding_strategy=no_shard"});
  const int64_t C = 2048, weights = 22 * 12 * C * C;
  const std::string report = dry_run_report(r, 1, true);
  INFO(report);
  CHECK_THAT(report, Contains("fp8 weight casts  " + format_bytes(2 * weights)));
  // Not with CUDA graphs, whose replays repeat the captured casts.
  const std::string graphed = dry_run_report(
      load_recipe("configs/gpt-1.3b.json", {"mixed_precision.fp8=hybrid", "train.cuda_graphs=true",
                                            "ddp.data_parallel_sharding_strategy=no_shard"}),
      1, true);
  CHECK_THAT(graphed, !Contains("fp8 weight casts"));
  // The head in FP8 too (fp8_classifier): named, and its weight (Vp, C) cast with the rest.
  const std::string head = dry_run_report(
      load_recipe("configs/gpt-1.3b.json", {"mixed_precision.fp8=hybrid", "mixed_precision.fp8_classifier=true",
                                            "ddp.data_parallel_sharding_strategy=no_shard"}),
      1, true);
  INFO(head);
  CHECK_THAT(head, Contains("in 88 linear layers of the blocks and the classifier (wte); bf16: embedding, attention"));
  CHECK_THAT(head, Contains("fp8 weight casts  " + format_bytes(2 * (weights + 50304 * C))));
}

TEST_CASE("the activation estimate counts the FP8 layers' copies", "[train][fp8]") {
  const Recipe r = load_recipe("configs/gpt-1.3b.json");
  const models::ModelConfig c = model_config_of(r);
  const int64_t n = 16 * 2048, C = c.d_model, F = c.d_ff;
  // The blocks 1 .. fp8_blocks in FP8 (the plan keeps the first and the last in bf16).
  auto estimate = [&](models::Recompute recompute, int tp, bool sp, int fp8_blocks) {
    std::vector<bool> mask(size_t(c.n_layer), false);
    for (int i = 1; i <= fp8_blocks; ++i) mask[size_t(i)] = true;
    return activation_bytes_estimate(c, 16, 2048, DType::bf16, recompute, tp, sp, mask);
  };
  const auto selective = models::Recompute::selective, none = models::Recompute::none;
  // Per FP8 block and token: the two norm outputs (2 bytes each per channel) replaced by
  // FP8 copies (1 byte), the attention output's FP8 copy beside it (1 byte); under
  // selective recompute the MLP's activation, not kept in bf16, gains its FP8 copy (F).
  CHECK(estimate(selective, 1, false, 22) - estimate(selective, 1, false, 0) == 22 * n * (F - C));
  // Without recompute the MLP's activation (F) is kept as an FP8 copy in place of its bf16.
  CHECK(estimate(none, 1, false, 0) - estimate(none, 1, false, 22) == 22 * n * (C + F));
  // Sequence parallelism keeps the norm outputs' parts in bf16: only the copies are added.
  CHECK(estimate(selective, 2, true, 22) - estimate(selective, 2, true, 0) == 22 * n * (C + F) / 2);
  // Full recompute keeps only the block inputs.
  CHECK(estimate(models::Recompute::full, 1, false, 22) == estimate(models::Recompute::full, 1, false, 0));
}

TEST_CASE("recomputing the first N blocks keeps their inputs and the others' activations",
          "[train]") {
  const Recipe r = load_recipe("configs/gpt-1.3b.json");
  const models::ModelConfig c = model_config_of(r);
  const int64_t L = c.n_layer, n = 4 * 2048, C = c.d_model, F = c.d_ff;
  std::vector<bool> fp8(size_t(L), true);  // the first and last blocks in bf16
  fp8.front() = fp8.back() = false;
  auto estimate = [&](models::Recompute mode, int64_t blocks) {
    return activation_bytes_estimate(c, 4, 2048, DType::bf16, mode, 1, false, fp8, blocks);
  };
  const auto full = models::Recompute::full, none = models::Recompute::none;
  CHECK(estimate(full, L) == estimate(full, -1));
  CHECK(estimate(full, 0) == estimate(none, -1));
  // Each block recomputed trades what it keeps without recompute for its input (n C bf16);
  // an FP8 block keeps one-byte copies of its norm outputs and MLP activation (C + F fewer
  // bytes a token).
  const int64_t bf16_block = estimate(full, 0) - estimate(full, 1);
  const int64_t fp8_block = estimate(full, 1) - estimate(full, 2);
  CHECK(bf16_block - fp8_block == n * (C + F));
  // Recomputing one more block saves memory, the last too here: its backward holds its
  // activations again, beside the recompute's output and gradients (autograd::recompute),
  // but no longer the head's logits buffer, which the forward's end holds beside them. (On
  // shapes whose head is small the last block's backward is the peak instead, and
  // recomputing it does not lower it: the tiny GPT-2 of tests/train/memory_plan_test.cc.)
  for (int64_t b = 0; b < L; ++b) CHECK(estimate(full, b) > estimate(full, b + 1));
}

TEST_CASE("the activation estimate counts attention's rotated queries and keys", "[train]") {
  // nn::causal_attention keeps rotated copies of q (H D) and k (Hkv D) beside the fused
  // projection; context parallelism keeps its packed copies instead of the projection.
  // (Without them the estimate was 2.2% under the peak an 8 x 512 Llama measured on a CPU
  // rank; tests/train/memory_plan_test.cc compares the whole prediction with measurements.)
  const Recipe r = load_recipe("configs/llama3-8b.json");
  const models::ModelConfig c = model_config_of(r);
  const int64_t n = 8192, L = c.n_layer, C = c.d_model, kv = c.n_kv_head * c.head_dim();
  const auto none = models::Recompute::none, full = models::Recompute::full;
  auto estimate = [&](models::Recompute mode, int64_t blocks, int cp) {
    return activation_bytes_estimate(c, 1, n, DType::bf16, mode, 1, false, {}, blocks, cp);
  };
  CHECK(estimate(none, -1, 1) - estimate(none, -1, 2) == L * n * (C + kv) * 2);
  // A recomputed block keeps only its input. With every block recomputed the 8B's peak is
  // the forward's end (the blocks' inputs beside the head's logits buffer), where no block
  // holds its copies; with 8 recomputed, the other 24 keep theirs.
  CHECK(estimate(full, -1, 1) == estimate(full, -1, 2));
  CHECK(estimate(full, 8, 1) - estimate(full, 8, 2) == (L - 8) * n * (C + kv) * 2);
  // GPT-2 (learned positions) has none.
  const models::ModelConfig g = model_config_of(load_recipe("configs/gpt2-124m.json"));
  CHECK(activation_bytes_estimate(g, 1, 1024, DType::bf16, none, 1, false, {}, -1, 1) ==
        activation_bytes_estimate(g, 1, 1024, DType::bf16, none, 1, false, {}, -1, 2));
}

TEST_CASE("a run that does not fit names its largest part and the recompute that would fit",
          "[train]") {
  const int64_t capacity = int64_t(device_memory_bytes(Device::cpu()));
  MemoryPrediction p;
  p.activations = capacity + capacity / 4;  // the rest (weights, optimizer) is empty
  for (int64_t blocks = 0; blocks <= 8; ++blocks)
    p.activations_recomputing.push_back(capacity + capacity / 4 - blocks * capacity / 10);
  // 0 blocks: 1.25 capacity; 2 blocks: 1.05; 3 blocks: 0.95, the first that fits.
  try {
    check_memory_fits(p, Device::cpu(), 1, 1);
    FAIL("the prediction was not refused");
  } catch (const ConfigError& e) {
    INFO(e.what());
    CHECK_THAT(e.what(), Contains("the largest part is activations") &&
                             Contains("model.activation_recompute=full model.recompute_num_layers=3") &&
                             Contains("--dry-run"));
  }
  // Nothing recompute frees makes it fit: the keys that size the run.
  p.activations_recomputing.assign(9, 2 * capacity);
  CHECK_THROWS_WITH(check_memory_fits(p, Device::cpu(), 1, 1),
                    Contains("lower model.n_layer") && Contains("optimizer.cpu_offload"));
}

TEST_CASE("a GPU run whose CPU offload exceeds the host's memory is refused, naming its parts",
          "[train]") {
  constexpr int64_t GiB = int64_t(1) << 30;
  MemoryPrediction p;
  p.fsdp.host_main_weights = size_t(30 * GiB);
  p.optimizer_state = size_t(15 * GiB);
  p.offload_staging = 17 * GiB;
  CHECK(p.host_offload() == 62 * GiB);
  check_host_memory_fits(p, 2, 124 * GiB);  // exactly fits
  try {
    check_host_memory_fits(p, 2, 100 * GiB);
    FAIL("the offload was not refused");
  } catch (const ConfigError& e) {
    INFO(e.what());
    CHECK_THAT(e.what(), Contains("page-locked host memory") && Contains("2 rank(s) on this host") &&
                             Contains("the largest part is master weights") &&
                             Contains("optimizer.moments_dtype=bf16") &&
                             Contains("optimizer.overlap_cpu_offload=false") && Contains("--dry-run"));
  }
  // The largest part is named whichever it is.
  p.offload_staging = 40 * GiB;
  CHECK_THROWS_WITH(check_host_memory_fits(p, 1, 50 * GiB),
                    Contains("the largest part is staging and gradient copies"));
  // Without offload nothing is held on the host.
  p.fsdp.host_main_weights = 0;
  CHECK(p.host_offload() == 0);
  check_host_memory_fits(p, 8, 0);
}

}  // namespace
}  // namespace fsdp::train
