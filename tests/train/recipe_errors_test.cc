// Bad recipes fail with a ConfigError that names the file, the full key path, and for unknown
// keys the nearest valid one.
#include <chrono>

#include "runtime/core/error.h"
#include "runtime/train/recipe.h"
#include "runtime/train/recipe_suggest.h"
#include "tests/test_support.h"

using namespace fsdp;
using namespace fsdp::train;

namespace {

// The message of the ConfigError that loading `json` with `overrides` throws.
std::string config_error(const std::string& json, const std::vector<std::string>& overrides = {}) {
  try {
    parse_recipe(json, overrides, "bad.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL("no ConfigError for " << json);
  return "";
}

}  // namespace

TEST_CASE("an unknown key suggests the nearest valid key", "[recipe]") {
  const std::string expected = "unknown key 'optimizer.learning_rate' (did you mean 'optimizer.lr'?)";
  CHECK_THAT(config_error(R"({"optimizer": {"learning_rate": 1}})"),
             Catch::StartsWith("bad.json: ") && Catch::Contains(expected));
  CHECK_THAT(config_error("{}", {"optimizer.learning_rate=1"}), Catch::Contains(expected));

  // Typos, a leaf in the wrong section, a key outside any section, a typo in the section.
  CHECK_THAT(config_error(R"({"optimizer": {"adam_beta": 0.9}})"),
             Catch::Contains("(did you mean 'optimizer.adam_beta1'?)"));
  CHECK_THAT(config_error(R"({"optimizer": {"lr_warmup_iters": 10}})"),
             Catch::Contains("unknown key 'optimizer.lr_warmup_iters' "
                             "(did you mean 'scheduler.lr_warmup_iters'?)"));
  CHECK_THAT(config_error(R"({"lr": 0.1})"),
             Catch::Contains("unknown key 'lr' (did you mean 'optimizer.lr'?)"));
  CHECK_THAT(config_error("{}", {"optimzer.lr=1"}),
             Catch::Contains("unknown key 'optimzer.lr' (did you mean 'optimizer.lr'?)"));
  CHECK_THAT(config_error("{}", {"model.num_layers=2"}),
             Catch::Contains("(did you mean 'model.n_layer'?)"));
  CHECK_THAT(config_error(R"({"train": {"train_iter": 5}})"),
             Catch::Contains("(did you mean 'train.train_iters'?)"));
  // Nothing close: no suggestion rather than a silly one.
  std::string far = config_error(R"({"model": {"zzzzzzzzzzzz": 1}})");
  CHECK_THAT(far, Catch::Contains("unknown key 'model.zzzzzzzzzzzz'"));
  CHECK_THAT(far, !Catch::Contains("did you mean"));
}

TEST_CASE("an unknown section suggests the nearest section", "[recipe]") {
  CHECK_THAT(config_error(R"({"optimiser": {"lr": 1}})"),
             Catch::Contains("unknown section 'optimiser' (did you mean 'optimizer'?)"));
  CHECK_THAT(config_error(R"({"training": {}})"),
             Catch::Contains("unknown section 'training' (did you mean 'train'?)"));
  CHECK_THAT(config_error("{}", {"optimizer={}"}),
             Catch::Contains("'optimizer' is a section; set one of its keys"));
  CHECK_THAT(config_error(R"({"optimizer": 3})"),
             Catch::Contains("section 'optimizer' must be an object of keys"));
  CHECK_THAT(config_error("[1, 2]"), Catch::Contains("a recipe must be a JSON object"));
}

TEST_CASE("a wrong type names the full key path and what it must be", "[recipe]") {
  CHECK_THAT(config_error(R"({"optimizer": {"lr": "fast"}})"),
             Catch::Contains("bad.json: 'optimizer.lr' must be a number, got string \"fast\""));
  CHECK_THAT(config_error(R"({"model": {"tie_embeddings": 1}})"),
             Catch::Contains("'model.tie_embeddings' must be true or false, got number 1"));
  CHECK_THAT(config_error(R"({"model": {"family": "bert"}})"),
             Catch::Contains("'model.family' must be one of \"gpt2\", \"llama\", got string \"bert\""));
  CHECK_THAT(config_error(R"({"run": {"name": ["a"]}})"),
             Catch::Contains("'run.name' must be a string, got array"));
  CHECK_THAT(config_error(R"({"train": {"micro_batch_size": {"x": 1}}})"),
             Catch::Contains("'train.micro_batch_size' must be an integer from -2147483648 to 2147483647, got object"));
  CHECK_THAT(config_error("{}", {"optimizer.lr=fast"}),
             Catch::Contains("override 'optimizer.lr=fast': 'optimizer.lr' must be a number"));
  CHECK_THAT(config_error("{}", {"model.tie_embeddings=yes"}),
             Catch::Contains("'model.tie_embeddings' must be true or false"));
  // Only numbers and booleans fall back to their text for a string key.
  CHECK_THAT(config_error("{}", {"run.name=[1, 2]"}),
             Catch::Contains("'run.name' must be a string, got array [1,2]"));
  CHECK_THAT(config_error("{}", {"optimizer.lr"}), Catch::Contains("expected KEY=VALUE"));
  CHECK_THAT(config_error("{}", {"=1"}), Catch::Contains("expected KEY=VALUE"));
}

TEST_CASE("JSON syntax errors name the file, line and column", "[recipe]") {
  // A trailing comma: the parser stops at the '}' on line 4, column 3.
  std::string text = "{\n  \"model\": {\n    \"n_layer\": 2,\n  }\n}\n";
  CHECK_THAT(config_error(text), Catch::StartsWith("bad.json:4:3: invalid JSON: "));
  CHECK_THAT(config_error("{\"run\": {\"name\": \"x\"}"), Catch::StartsWith("bad.json:1:"));
  CHECK_THAT(config_error("{\n\n  \"run\": {\"seed\": 1x}}"), Catch::StartsWith("bad.json:3:"));
  CHECK_THAT(config_error(""), Catch::StartsWith("bad.json:1:1: invalid JSON"));
  // A number past a double's range (found by fuzzing: it escaped as the JSON library's own
  // exception).
  CHECK_THAT(config_error("{\"optimizer\": {\"lr\": -4444e44444}}"),
             Catch::StartsWith("bad.json: invalid JSON: number overflow"));
}

TEST_CASE("a key given twice is refused", "[recipe]") {
  CHECK_THAT(config_error(R"({"optimizer": {"lr": 1, "min_lr": 0, "lr": 2}})"),
             Catch::Contains("key 'optimizer.lr' appears twice"));
  CHECK_THAT(config_error(R"({"run": {"seed": 1}, "run": {"name": "x"}})"),
             Catch::Contains("key 'run' appears twice"));
}

TEST_CASE("out-of-range values name the key, the range and where they were set", "[recipe]") {
  CHECK_THAT(config_error(R"({"optimizer": {"adam_beta1": 1.0}})"),
             Catch::Contains("'optimizer.adam_beta1' = 1.0 is out of range: must be in [0, 1) "
                             "(set in bad.json)"));
  CHECK_THAT(config_error("{}", {"optimizer.lr=-1"}),
             Catch::Contains("'optimizer.lr' = -1.0 is out of range: must be >= 0 "
                             "(set in override 'optimizer.lr=-1')"));
  CHECK_THAT(config_error(R"({"model": {"n_layer": 0}})"),
             Catch::Contains("'model.n_layer' = 0 is out of range: must be >= 1"));
  CHECK_THAT(config_error(R"({"train": {"micro_batch_size": -4}})"),
             Catch::Contains("'train.micro_batch_size'"));
  CHECK_THAT(config_error(R"({"dataset": {"val_fraction": 1}})"),
             Catch::Contains("'dataset.val_fraction'"));
  CHECK_THAT(config_error(R"({"dist": {"dp_shard": 0}})"),
             Catch::Contains("'dist.dp_shard' must be -1 (fill the world) or >= 1"));
  // A zero timeout would fail later naming no key; a zero epsilon would divide by zero.
  CHECK_THAT(config_error("{}", {"dist.distributed_timeout_minutes=0"}),
             Catch::Contains("'dist.distributed_timeout_minutes' = 0.0 is out of range: must be "
                             "in (0, 525600]"));
  CHECK_THAT(config_error("{}", {"dist.distributed_timeout_minutes=1e300"}),
             Catch::Contains("'dist.distributed_timeout_minutes'"));
  CHECK(parse_recipe("{}", {"dist.distributed_timeout_minutes=0.5"}).dist.distributed_timeout_minutes == 0.5);
  CHECK_THAT(config_error(R"({"optimizer": {"adam_eps": 0}})"),
             Catch::Contains("'optimizer.adam_eps' = 0.0 is out of range: must be > 0 (set in bad.json)"));
  CHECK_THAT(config_error("{}", {"optimizer.adam_eps=-1e-8"}), Catch::Contains("'optimizer.adam_eps'"));
  // An override may repair a bad file value: ranges are checked after overrides.
  CHECK(parse_recipe(R"({"optimizer": {"lr": -1}})", {"optimizer.lr=0.5"}).optimizer.lr == 0.5);
}

TEST_CASE("keys that disagree with each other are named", "[recipe]") {
  CHECK_THAT(config_error(R"({"model": {"d_model": 100, "n_head": 12}})"),
             Catch::Contains("'model.d_model' (100) must be divisible by 'model.n_head' (12)"));
  CHECK_THAT(config_error(R"({"model": {"family": "llama", "n_head": 12, "n_kv_head": 5}})"),
             Catch::Contains("must be a multiple of 'model.n_kv_head' (5)"));
  CHECK_THAT(config_error(R"({"model": {"n_head": 12, "n_kv_head": 4}})"),
             Catch::Contains("for family \"gpt2\""));
  CHECK_THAT(config_error(R"({"model": {"vocab_size": 100, "padded_vocab_size": 64}})"),
             Catch::Contains("'model.padded_vocab_size' (64) must be at least 'model.vocab_size'"));
  CHECK_THAT(config_error(R"({"train": {"micro_batch_size": 3, "global_batch_size": 8}})"),
             Catch::Contains("'train.global_batch_size' (8) must be a multiple of "
                             "'train.micro_batch_size' (3)"));
  CHECK_THAT(config_error(R"({"optimizer": {"lr": 1e-4, "min_lr": 1e-3}})"),
             Catch::Contains("'optimizer.min_lr' (0.001) must not exceed 'optimizer.lr'"));
  CHECK_THAT(config_error(R"({"optimizer": {"optimizer": "muon", "lr": 0, "min_lr": 0, "muon_adamw_lr": 1e-3}})"),
             Catch::Contains("'optimizer.muon_adamw_lr' (0.001) scales the schedule of 'optimizer.lr'"));
  CHECK_THAT(config_error(R"({"train": {"train_iters": 10}, "scheduler": {"lr_warmup_iters": 20}})"),
             Catch::Contains("'scheduler.lr_warmup_iters' (20) must not exceed"));
  CHECK_THAT(config_error(R"({"scheduler": {"lr_decay_style": "WSD"}})"),
             Catch::Contains("needs 'scheduler.lr_wsd_decay_iters' >= 1"));
  CHECK_THAT(config_error(R"({"train": {"train_iters": 100},
                              "scheduler": {"lr_decay_style": "WSD", "lr_warmup_iters": 10,
                                            "lr_wsd_decay_iters": 95}})"),
             Catch::Contains("'scheduler.lr_wsd_decay_iters' (95) must fit after the warmup"));
  CHECK_THAT(config_error(R"({"mixed_precision": {"grad_reduce_dtype": "bf16"}})"),
             Catch::Contains("'ddp.grad_reduce_in_fp32' is true"));
  CHECK_THAT(config_error(R"({"checkpoint": {"save": ""}})"),
             Catch::Contains("'checkpoint.save' is empty; use null"));
}

TEST_CASE("tensor and context parallelism that cannot run are refused by key", "[recipe]") {
  // Heads, key/value heads and MLP features must split evenly over the tensor-parallel ranks.
  CHECK_THAT(config_error(R"({"model": {"n_head": 12, "d_model": 768,
                                        "tensor_model_parallel_size": 8}})"),
             Catch::Contains("'model.n_head' (12) is not divisible by "
                             "'model.tensor_model_parallel_size' (8)"));
  // Key/value heads split over the ranks or replicated on them (2 heads on 4 ranks is fine).
  CHECK_THAT(config_error(R"({"model": {"family": "llama", "n_head": 12, "n_kv_head": 3,
                                        "d_model": 768, "d_ff": 2048,
                                        "tensor_model_parallel_size": 4}})"),
             Catch::Contains("'model.n_kv_head' (3) neither divides nor is divisible by "
                             "'model.tensor_model_parallel_size' (4)"));
  CHECK_THAT(config_error(R"({"model": {"d_ff": 100, "n_head": 8, "d_model": 64,
                                        "tensor_model_parallel_size": 8}})"),
             Catch::Contains("'model.d_ff' (100) is not divisible"));
  // The embedding and the head split the (padded) vocabulary's rows.
  CHECK_THAT(config_error(R"({"model": {"n_head": 4, "d_model": 64, "vocab_size": 200,
                                        "padded_vocab_size": 250,
                                        "tensor_model_parallel_size": 4}})"),
             Catch::Contains("'model.padded_vocab_size' (250) is not divisible by "
                             "'model.tensor_model_parallel_size' (4)"));
  // What is not built yet says so.
  CHECK_THAT(config_error(R"({"model": {"sequence_parallel": true, "seq_length": 30, "n_head": 4,
                                        "d_model": 64, "tensor_model_parallel_size": 4}})"),
             Catch::Contains("'model.seq_length' (30) is not divisible by "
                             "'model.tensor_model_parallel_size' (4), as 'model.sequence_parallel' "
                             "needs"));
  // Context parallelism: two chunks of every sequence per rank.
  CHECK_THAT(config_error(R"({"model": {"context_parallel_size": 3, "seq_length": 64}})"),
             Catch::Contains("'model.seq_length' (64) is not divisible by 2 x "
                             "'model.context_parallel_size' (6)"));
  CHECK_THAT(config_error("{}", {"model.seq_length=33", "model.context_parallel_size=2"}),
             Catch::Contains("'model.seq_length' (33) is not divisible by 2 x "
                             "'model.context_parallel_size' (4)"));
  // Without context parallelism any length will do.
  CHECK(parse_recipe("{}", {"model.seq_length=33"}).model.seq_length == 33);
}

TEST_CASE("bf16 compute on the CPU is refused when the device is settled, naming the key",
          "[recipe]") {
  Recipe cpu = parse_recipe("{}", {"mixed_precision.compute_dtype=bf16"});
  CHECK_THROWS_AS(cpu.resolve_device(/*cuda_available=*/false), ConfigError);
  CHECK_THROWS_WITH(cpu.resolve_device(false),
                    Catch::Contains("'mixed_precision.compute_dtype' is \"bf16\" but 'dist.device' "
                                    "is \"cpu\"") &&
                        Catch::Contains("use \"f32\""));
  Recipe explicit_cpu = parse_recipe("{}", {"mixed_precision.compute_dtype=bf16", "dist.device=cpu"});
  CHECK_THROWS_WITH(explicit_cpu.resolve_device(true), Catch::Contains("'mixed_precision.compute_dtype'"));
  // On a GPU it is the default.
  Recipe gpu = parse_recipe("{}", {"mixed_precision.compute_dtype=bf16"});
  CHECK_NOTHROW(gpu.resolve_device(true));
}

TEST_CASE("JSON nested too deeply is refused at once, naming the file", "[recipe]") {
  // An unknown value 40,000 levels deep in a known section: parsed, it took seconds (the
  // time grew with the square of the depth).
  const int depth = 40000;
  std::string deep = R"({"model": )";
  for (int i = 0; i < depth; ++i) deep += R"({"x": )";
  deep += "1";
  deep += std::string(size_t(depth) + 1, '}');
  const auto start = std::chrono::steady_clock::now();
  CHECK_THAT(config_error(deep), Catch::StartsWith("bad.json:1:") &&
                                     Catch::Contains("JSON nested deeper than 128 levels"));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
  // The column is the first bracket past the limit; brackets inside strings do not count.
  CHECK_THAT(config_error(std::string(200, '[')), Catch::StartsWith("bad.json:1:129: JSON nested"));
  const std::string brackets(500, '[');
  CHECK(parse_recipe(R"({"run": {"name": ")" + brackets + R"("}})").run.name == brackets);
  // An override's value too.
  CHECK_THAT(config_error("{}", {"run.name=" + std::string(200, '[')}),
             Catch::Contains("override of 'run.name'") && Catch::Contains("nested deeper"));
}

TEST_CASE("edit distance counts single-character edits", "[recipe]") {
  CHECK(edit_distance("", "") == 0);
  CHECK(edit_distance("lr", "") == 2);
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("optimiser", "optimizer") == 1);
  CHECK(edit_distance("abc", "abc") == 0);
  CHECK(suggest_key("optimizer.lr") == std::optional<std::string>("optimizer.lr"));
  CHECK_FALSE(suggest_section("qqqqqqqqqq").has_value());
}

TEST_CASE("strings that are not UTF-8 are refused by key, in files and overrides", "[recipe]") {
  // A stray continuation byte, a truncated sequence, an overlong '/', a surrogate.
  for (const char* bad : {"x\xff", "x\xc3", "\xc0\xaf", "\xed\xa0\x80"}) {
    CHECK_THAT(config_error("{}", {std::string("run.name=") + bad}),
               Catch::Contains("'run.name' is not valid UTF-8 text"));
    // In a file the JSON reader refuses it first, naming the file, line and column.
    CHECK_THAT(config_error(std::string(R"({"run": {"name": ")") + bad + "\"}}"),
               Catch::StartsWith("bad.json:1:") && Catch::Contains("UTF-8"));
  }
  // Real UTF-8 passes and survives the resolved recipe's JSON.
  const Recipe r = parse_recipe("{}", {"run.name=Émma – 📚"});
  CHECK(r.run.name == "Émma – 📚");
  CHECK_NOTHROW(r.to_json_string());
}

TEST_CASE("an int key out of its range says the range", "[recipe]") {
  CHECK_THAT(config_error("{}", {"train.micro_batch_size=3000000000"}),
             Catch::Contains("must be an integer from -2147483648 to 2147483647"));
}

TEST_CASE("log files must stay inside run.output_dir", "[recipe]") {
  for (const char* name : {"../x.jsonl", "a/../../x", "/tmp/x", ".."}) {
    INFO(name);
    CHECK_THAT(config_error("{}", {std::string("logger.metrics_file=") + name}),
               Catch::Contains("'logger.metrics_file'"));
    CHECK_THAT(config_error("{}", {std::string("logger.samples_file=") + name}),
               Catch::Contains("'logger.samples_file'"));
  }
  CHECK_NOTHROW(parse_recipe("{}", {"logger.metrics_file=logs/m..jsonl"}));
}

TEST_CASE("a recipe path that is missing or a directory is a configuration error", "[recipe]") {
  CHECK_THROWS_WITH(load_recipe("/nonexistent/recipe.json"), Catch::Contains("does not exist"));
  CHECK_THROWS_AS(load_recipe("/nonexistent/recipe.json"), ConfigError);
  CHECK_THROWS_WITH(load_recipe("/"), Catch::Contains("is not a file"));
}

TEST_CASE("MoE recipes refuse what this build cannot run, by key", "[recipe][moe]") {
  const std::string moe = R"({"model": {"num_moe_experts": 4, "moe_router_topk": 2}})";
  CHECK_THAT(config_error(moe, {"model.moe_router_topk=5"}),
             Catch::Contains("'model.moe_router_topk' (5) must not exceed 'model.num_moe_experts' (4)"));
  CHECK_THAT(config_error(moe, {"model.expert_model_parallel_size=3"}),
             Catch::Contains("'model.num_moe_experts' (4) must be a multiple of "
                             "'model.expert_model_parallel_size' (3)"));
  CHECK_THAT(config_error(R"({"model": {}})", {"model.expert_model_parallel_size=2"}),
             Catch::Contains("'model.expert_model_parallel_size' 2 needs a mixture-of-experts model"));
  CHECK_THAT(config_error(moe, {"model.expert_model_parallel_size=2",
                                "model.moe_token_dispatcher_type=allgather"}),
             Catch::Contains("'model.moe_token_dispatcher_type' 'allgather' with "
                             "'model.expert_model_parallel_size' 2"));
  // Checkpoints store the experts by global index: expert parallelism saves and resumes.
  CHECK_NOTHROW(parse_recipe(moe, {"model.expert_model_parallel_size=2", "checkpoint.save=/tmp/x",
                                   "checkpoint.load=latest"}));
  CHECK_THAT(config_error(moe, {"model.tensor_model_parallel_size=2"}),
             Catch::Contains("'model.tensor_model_parallel_size' 2 with 'model.num_moe_experts' 4 "
                             "needs 'model.sequence_parallel' true"));
  CHECK_NOTHROW(parse_recipe(moe, {"model.tensor_model_parallel_size=2", "model.sequence_parallel=true"}));
  // Context parallelism splits the sequences; the MoE layer's balancing loss sums their
  // parts' choices (moe_train_test).
  CHECK_NOTHROW(parse_recipe(moe, {"model.context_parallel_size=2"}));
  CHECK_THAT(config_error(moe, {"model.moe_router_score_function=relu"}),
             Catch::Contains("model.moe_router_score_function"));
  CHECK_THAT(config_error(moe, {"model.moe_token_dispatcher_type=flex"}),
             Catch::Contains("model.moe_token_dispatcher_type"));
  CHECK_NOTHROW(parse_recipe(moe, {"model.moe_token_dispatcher_type=allgather"}));
  // The shared expert's overlap needs a shared expert.
  CHECK_THAT(config_error(moe, {"model.moe_shared_expert_overlap=true"}),
             Catch::Contains("'model.moe_shared_expert_overlap' true needs MoE layers with a "
                             "shared expert"));
  CHECK_THAT(config_error(R"({"model": {}})", {"model.moe_shared_expert_overlap=true"}),
             Catch::Contains("'model.moe_shared_expert_overlap' true needs MoE layers"));
  CHECK_NOTHROW(parse_recipe(moe, {"model.moe_shared_expert_overlap=true",
                                   "model.moe_shared_expert_intermediate_size=32",
                                   "model.expert_model_parallel_size=2"}));
}
