// Every shipped recipe in configs/ loads and validates, and the named ones say what they
// promise.
#include <filesystem>
#include <map>

#include "runtime/train/recipe.h"
#include "tests/test_support.h"

using namespace fsdp::train;

namespace {

std::map<std::string, Recipe> load_all_configs() {
  std::map<std::string, Recipe> recipes;
  for (const auto& entry : std::filesystem::directory_iterator("configs")) {
    if (entry.path().extension() != ".json") continue;
    INFO(entry.path().string());
    recipes.emplace(entry.path().filename().string(), load_recipe(entry.path().string()));
  }
  return recipes;
}

}  // namespace

TEST_CASE("every recipe in configs/ loads and splits its batch", "[recipe][configs]") {
  std::map<std::string, Recipe> recipes = load_all_configs();
  REQUIRE(recipes.size() >= 4);
  for (const auto& [name, r] : recipes) {
    INFO(name);
    CHECK_NOTHROW(r.validate_world(1));
    CHECK(r.grad_accum_steps(1) >= 1);
    CHECK(r.model.padded_vocab_size % 128 == 0);
    // All use the shipped GPT-2 tokenizer; the recipes of published models (the MoE ones,
    // Llama3-8B) keep their models' larger vocabularies (for memory and FLOP estimates),
    // which hold its ids.
    const bool published = (r.model.num_moe_experts > 0 && name != "moe-tiny.json") ||
                           name == "llama3-8b.json";
    if (!published)
      CHECK(r.model.vocab_size == 50257);
    else
      CHECK(r.model.vocab_size >= 50257);
    CHECK(r.run.output_dir.rfind("runs/", 0) == 0);
  }
}

TEST_CASE("configs/tiny.json is a small GPT-2 for CPUs on the embedded text", "[configs]") {
  Recipe r = load_recipe("configs/tiny.json");
  CHECK(r.model.family == "gpt2");
  CHECK(r.model.n_layer >= 2);
  CHECK(r.model.n_layer <= 4);
  CHECK(r.model.d_model >= 64);
  CHECK(r.model.d_model <= 128);
  CHECK(r.model.n_head == 4);
  CHECK(r.model.seq_length == 64);
  CHECK(r.train.micro_batch_size >= 4);
  CHECK(r.train.micro_batch_size <= 8);
  CHECK(r.train.train_iters == 200);
  CHECK(r.optimizer.lr == 1e-3);
  CHECK(r.scheduler.lr_decay_style == "cosine");
  CHECK(r.scheduler.lr_warmup_iters > 0);
  CHECK(r.scheduler.lr_warmup_iters <= 20);
  CHECK(r.dataset.type == "text");
  CHECK(r.dataset.train_path == "third_party/text/austen.txt");
  CHECK(r.dist.device == "auto");
  CHECK(r.ddp.data_parallel_sharding_strategy == "no_shard");
  CHECK(r.run.output_dir == "runs/tiny");
  // It needs nothing but what the repository ships.
  CHECK(std::filesystem::is_regular_file(r.dataset.train_path));
  CHECK(std::filesystem::is_regular_file(r.tokenizer.vocab_file));
  CHECK(std::filesystem::is_regular_file(r.tokenizer.merges_file));
  // Its batch splits over the world sizes the parity tests use.
  for (int dp : {1, 2, 4}) CHECK_NOTHROW(parse_recipe(r.to_json_string(), {"train.global_batch_size=8",
                                                                       "train.micro_batch_size=2"})
                                             .validate_world(dp));
}

TEST_CASE("configs/gpt2-124m.json is llm.c's GPT-2 124M recipe", "[configs]") {
  Recipe r = load_recipe("configs/gpt2-124m.json");
  CHECK(r.model.n_layer == 12);
  CHECK(r.model.d_model == 768);
  CHECK(r.model.n_head == 12);
  CHECK(r.model.seq_length == 1024);
  CHECK(r.model.padded_vocab_size == 50304);
  CHECK(r.model.tie_embeddings);
  CHECK(r.train.micro_batch_size == 64);
  CHECK(r.train.global_batch_size * r.model.seq_length == 524288);
  CHECK(r.train.train_iters == 18865);
  CHECK(r.optimizer.lr == 6e-4);
  CHECK(r.optimizer.min_lr == 0.0);
  CHECK(r.optimizer.weight_decay == 0.1);
  CHECK(r.optimizer.clip_grad == 1.0);
  CHECK(r.optimizer.adam_beta1 == 0.9);
  CHECK(r.optimizer.adam_beta2 == 0.95);
  CHECK(r.scheduler.lr_warmup_iters == 700);
  CHECK(r.scheduler.lr_decay_style == "cosine");
  CHECK(r.mixed_precision.compute_dtype == "bf16");
  CHECK(r.dataset.type == "llmc");
  for (int dp : {1, 2, 4, 8}) CHECK(r.grad_accum_steps(dp) == 8 / dp);
}

TEST_CASE("configs/gpt-1.3b.json is a ZeRO-3 GPT of 1.3B parameters", "[configs]") {
  Recipe r = load_recipe("configs/gpt-1.3b.json");
  CHECK(r.model.n_layer == 24);
  CHECK(r.model.d_model == 2048);
  CHECK(r.model.n_head == 16);
  CHECK(r.model.seq_length == 2048);
  CHECK(r.model.padded_vocab_size == 50304);
  CHECK(r.model.tie_embeddings);
  CHECK(r.train.micro_batch_size == 16);
  CHECK(r.ddp.data_parallel_sharding_strategy == "optim_grads_params");
}

TEST_CASE("configs/llama-1b.json is a Llama-style model of about 1B parameters", "[configs]") {
  Recipe r = load_recipe("configs/llama-1b.json");
  const ModelSection& m = r.model;
  CHECK(m.family == "llama");
  CHECK(m.n_kv_head == 8);
  CHECK(m.n_head == 32);
  CHECK(m.d_ff == 8192);
  CHECK(m.rope_theta == 500000.0);
  CHECK_FALSE(m.tie_embeddings);
  CHECK(r.run.name.find("gpt2-vocab") != std::string::npos);
  // Weights: untied embedding and head, GQA attention, SwiGLU MLP, two RMSNorms per block.
  int64_t d = m.d_model, kv = d / m.n_head * m.n_kv_head;
  int64_t per_block = 2 * d * d + 2 * d * kv + 3 * d * m.d_ff + 2 * d;
  int64_t total = 2 * int64_t(m.padded_vocab_size) * d + m.n_layer * per_block + d;
  CHECK(total > 900000000);
  CHECK(total < 1300000000);
}

TEST_CASE("configs/llama-7b.json is a Llama-style model of about 7B parameters", "[configs]") {
  Recipe r = load_recipe("configs/llama-7b.json");
  const ModelSection& m = r.model;
  CHECK(m.family == "llama");
  CHECK(m.n_layer == 32);
  CHECK(m.d_model == 4096);
  CHECK(m.n_kv_head == 8);
  CHECK(r.ddp.data_parallel_sharding_strategy == "optim_grads_params");
  CHECK(r.model.activation_recompute == "full");
  int64_t d = m.d_model, kv = d / m.n_head * m.n_kv_head;
  int64_t per_block = 2 * d * d + 2 * d * kv + 3 * d * m.d_ff + 2 * d;
  int64_t total = 2 * int64_t(m.padded_vocab_size) * d + m.n_layer * per_block + d;
  CHECK(total > 6500000000);
  CHECK(total < 8000000000);
}

TEST_CASE("configs/moe-tiny.json is a small Llama MoE for CPUs on the embedded text", "[configs]") {
  Recipe r = load_recipe("configs/moe-tiny.json");
  CHECK(r.model.family == "llama");
  CHECK(r.model.n_layer == 4);
  CHECK(r.model.d_model == 128);
  CHECK(r.model.num_moe_experts == 8);
  CHECK(r.model.moe_router_topk == 2);
  CHECK(r.model.moe_ffn_hidden_size == 256);
  CHECK(r.model.moe_shared_expert_intermediate_size == 256);
  CHECK(r.model.moe_aux_loss_coeff > 0);
  CHECK(r.dist.device == "auto");
  CHECK(std::filesystem::is_regular_file(r.dataset.train_path));
  for (int dp : {1, 2, 4}) CHECK_NOTHROW(parse_recipe(r.to_json_string(), {"train.global_batch_size=8",
                                                                       "train.micro_batch_size=2"})
                                             .validate_world(dp));
}

TEST_CASE("configs/olmoe-1b-7b.json and qwen3-30b-a3b.json are the published MoE shapes",
          "[configs]") {
  Recipe o = load_recipe("configs/olmoe-1b-7b.json");
  CHECK(o.model.n_layer == 16);
  CHECK(o.model.d_model == 2048);
  CHECK(o.model.n_head == 16);
  CHECK(o.model.num_moe_experts == 64);
  CHECK(o.model.moe_router_topk == 8);
  CHECK(o.model.moe_ffn_hidden_size == 1024);
  CHECK(o.model.vocab_size == 50304);
  CHECK(o.model.seq_length == 4096);
  CHECK(o.model.moe_router_score_function == "softmax");
  CHECK_FALSE(o.model.moe_router_normalize);
  CHECK(o.model.moe_aux_loss_coeff == 0.01);
  CHECK(o.model.moe_z_loss_coeff == 0.001);
  Recipe q = load_recipe("configs/qwen3-30b-a3b.json");
  CHECK(q.model.n_layer == 48);
  CHECK(q.model.d_model == 2048);
  CHECK(q.model.n_head == 32);
  CHECK(q.model.n_kv_head == 4);
  CHECK(q.model.num_moe_experts == 128);
  CHECK(q.model.moe_router_topk == 8);
  CHECK(q.model.moe_ffn_hidden_size == 768);
  CHECK(q.model.vocab_size == 151936);
  CHECK(q.model.moe_router_normalize);
}
