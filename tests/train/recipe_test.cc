// Recipe loading: defaults, derived values, overrides, world/device resolution, round trips,
// and the text the schema generates (--help, dry-run).
#include <filesystem>
#include <fstream>
#include <set>

#include "runtime/core/error.h"
#include "runtime/train/recipe.h"
#include "runtime/train/recipe_schema.h"
#include "tests/test_support.h"
#include "tests/train/scratch_dir.h"

using namespace fsdp;
using namespace fsdp::train;

TEST_CASE("an empty recipe gets every schema default", "[recipe]") {
  Recipe r = parse_recipe("{}");
  CHECK(r.model.family == "gpt2");
  CHECK(r.model.n_layer == 12);
  CHECK(r.model.vocab_size == 50257);
  CHECK(r.optimizer.optimizer == "adamw");
  CHECK(r.optimizer.lr == 3e-4);
  CHECK(r.optimizer.adam_beta2 == 0.95);
  CHECK(r.scheduler.lr_decay_style == "cosine");
  CHECK(r.ddp.data_parallel_sharding_strategy == "optim_grads_params");
  CHECK(r.dist.dp_shard == -1);
  CHECK(r.mixed_precision.compute_dtype == "auto");
  CHECK_FALSE(r.checkpoint.save.has_value());
  CHECK_FALSE(r.logger.tensorboard_dir.has_value());
  REQUIRE(r.checkpoint.load.has_value());
  CHECK(*r.checkpoint.load == "latest");
  CHECK(r.tokenizer.vocab_file == "third_party/gpt2_tokenizer/encoder.json");
  CHECK(r.tokenizer.merges_file == "third_party/gpt2_tokenizer/vocab.bpe");
  // The default-constructed recipe is the same recipe.
  CHECK(Recipe().to_json_string() == r.to_json_string());
}

TEST_CASE("ddp.nccl_ub: off by default; symmetric or local registration", "[recipe]") {
  Recipe r = parse_recipe("{}");
  CHECK_FALSE(r.ddp.nccl_ub);
  CHECK(r.ddp.nccl_ub_registration == "symmetric");
  Recipe on = parse_recipe(R"({"ddp": {"nccl_ub": true}})", {"ddp.nccl_ub_registration=local"});
  CHECK(on.ddp.nccl_ub);
  CHECK(on.ddp.nccl_ub_registration == "local");
  CHECK(parse_recipe("{}", {"ddp.nccl_ub=true"}).ddp.nccl_ub);
  CHECK_THROWS_WITH(parse_recipe("{}", {"ddp.nccl_ub_registration=window"}),
                    Catch::Contains("ddp.nccl_ub_registration"));
  CHECK_THROWS_AS(parse_recipe(R"({"ddp": {"nccl_ub": "yes"}})"), ConfigError);
}

TEST_CASE("derived keys are resolved from the others", "[recipe]") {
  Recipe r = parse_recipe("{}");
  CHECK(r.model.d_ff == 4 * 768);
  CHECK(r.model.n_kv_head == 12);
  CHECK(r.model.padded_vocab_size == 50304);  // 50257 rounded up to a multiple of 128
  CHECK(r.scheduler.lr_decay_iters == r.train.train_iters);

  // Derived from the values the user set, not from the defaults.
  Recipe small = parse_recipe(R"({"model": {"d_model": 256, "n_head": 4, "vocab_size": 1000},
                                  "train": {"train_iters": 77}})");
  CHECK(small.model.d_ff == 1024);
  CHECK(small.model.n_kv_head == 4);
  CHECK(small.model.padded_vocab_size == 1024);
  CHECK(small.scheduler.lr_decay_iters == 77);

  // Llama: 2/3 of 4*d, rounded up to a multiple of 256 (4096 -> 11008, as Llama 7B).
  Recipe llama = parse_recipe(R"({"model": {"family": "llama", "d_model": 4096, "n_head": 32}})");
  CHECK(llama.model.d_ff == 11008);
  Recipe llama2k = parse_recipe(R"({"model": {"family": "llama", "d_model": 2048, "n_head": 16}})");
  CHECK(llama2k.model.d_ff == 5632);

  // Values given explicitly are kept.
  Recipe given = parse_recipe(R"({"model": {"d_ff": 1000, "padded_vocab_size": 50260}})");
  CHECK(given.model.d_ff == 1000);
  CHECK(given.model.padded_vocab_size == 50260);
}

TEST_CASE("overrides parse VALUE as JSON, else as a string", "[recipe]") {
  std::string file = R"({"optimizer": {"lr": 0.1}, "run": {"name": "from-file"}})";
  Recipe r = parse_recipe(file, {"optimizer.lr=1e-3", "train.train_iters=50",
                                 "model.tie_embeddings=false", "run.name=hello world",
                                 "dataset.train_path=data/shard_*.bin", "checkpoint.save=ckpt",
                                 "optimizer.clip_grad=2", "logger.tensorboard_dir=runs/tb"});
  CHECK(r.optimizer.lr == 1e-3);  // the override wins over the file
  CHECK(r.train.train_iters == 50);
  CHECK(r.scheduler.lr_decay_iters == 50);  // derived after overrides
  CHECK_FALSE(r.model.tie_embeddings);
  CHECK(r.run.name == "hello world");
  CHECK(r.dataset.train_path == "data/shard_*.bin");
  REQUIRE(r.checkpoint.save.has_value());
  CHECK(*r.checkpoint.save == "ckpt");
  CHECK(r.optimizer.clip_grad == 2.0);  // an integer is a fine number
  CHECK(r.logger.tensorboard_dir == std::optional<std::string>("runs/tb"));

  // A string key given something that parses as a number or bool keeps the text.
  Recipe numeric_name = parse_recipe("{}", {"run.name=2024", "run.output_dir=true"});
  CHECK(numeric_name.run.name == "2024");
  CHECK(numeric_name.run.output_dir == "true");
  // A JSON string is unquoted.
  CHECK(parse_recipe("{}", {R"(run.name="quoted")"}).run.name == "quoted");
  // The last override of a key wins.
  CHECK(parse_recipe("{}", {"optimizer.lr=1", "optimizer.lr=2"}).optimizer.lr == 2.0);
}

TEST_CASE("null clears a nullable key and is refused elsewhere", "[recipe]") {
  Recipe r = parse_recipe(R"({"checkpoint": {"save": "ckpt"}})",
                          {"checkpoint.save=null", "checkpoint.load=null", "logger.metrics_file=null"});
  CHECK_FALSE(r.checkpoint.save.has_value());
  CHECK_FALSE(r.checkpoint.load.has_value());
  CHECK_FALSE(r.logger.metrics_file.has_value());
  CHECK_FALSE(parse_recipe(R"({"dataset": {"val_path": null}})").dataset.val_path.has_value());

  CHECK_THROWS_WITH(parse_recipe("{}", {"run.seed=null"}),
                    Catch::Contains("'run.seed' must be an integer, got null"));
  CHECK_THROWS_AS(parse_recipe(R"({"optimizer": {"lr": null}})"), ConfigError);
}

TEST_CASE("integers and floats are told apart", "[recipe]") {
  CHECK(parse_recipe(R"({"train": {"train_iters": 1e3}})").train.train_iters == 1000);
  CHECK(parse_recipe(R"({"train": {"train_iters": 2.0}})").train.train_iters == 2);
  CHECK_THROWS_WITH(parse_recipe(R"({"train": {"train_iters": 2.5}})"),
                    Catch::Contains("'train.train_iters' must be an integer, got number 2.5"));
  CHECK_THROWS_WITH(parse_recipe(R"({"model": {"n_layer": 3000000000}})"),
                    Catch::Contains("'model.n_layer' must be an integer"));
  CHECK(parse_recipe(R"({"optimizer": {"lr": 1}})").optimizer.lr == 1.0);
}

TEST_CASE("sharding strategies accept the integer codes 0..3", "[recipe]") {
  const char* names[] = {"no_shard", "optim", "optim_grads", "optim_grads_params"};
  for (int code = 0; code < 4; ++code) {
    std::string file = R"({"ddp": {"data_parallel_sharding_strategy": )" + std::to_string(code) + "}}";
    CHECK(parse_recipe(file).ddp.data_parallel_sharding_strategy == names[code]);
    std::string o = "ddp.data_parallel_sharding_strategy=" + std::to_string(code);
    CHECK(parse_recipe("{}", {o}).ddp.data_parallel_sharding_strategy == names[code]);
  }
  // Names are matched without regard to case and stored canonically.
  CHECK(parse_recipe("{}", {"ddp.data_parallel_sharding_strategy=OPTIM"})
            .ddp.data_parallel_sharding_strategy == "optim");
  CHECK(parse_recipe("{}", {"scheduler.lr_decay_style=wsd", "scheduler.lr_wsd_decay_iters=10"})
            .scheduler.lr_decay_style == "WSD");
  CHECK_THROWS_WITH(parse_recipe("{}", {"ddp.data_parallel_sharding_strategy=4"}),
                    Catch::Contains("'ddp.data_parallel_sharding_strategy' must be one of") &&
                        Catch::Contains("(or 0..3)"));
  // Codes are only for keys that declare them.
  CHECK_THROWS_AS(parse_recipe(R"({"model": {"family": 0}})"), ConfigError);
}

TEST_CASE("validate_world and grad_accum_steps check the batch split", "[recipe]") {
  Recipe r = parse_recipe(R"({"train": {"micro_batch_size": 64, "global_batch_size": 512}})");
  CHECK_NOTHROW(r.validate_world(1));
  CHECK_NOTHROW(r.validate_world(8));
  CHECK(r.grad_accum_steps(1) == 8);
  CHECK(r.grad_accum_steps(2) == 4);
  CHECK(r.grad_accum_steps(8) == 1);
  CHECK_THROWS_WITH(r.validate_world(3),
                    Catch::Contains("'train.global_batch_size' (512) must be a multiple of "
                                    "'train.micro_batch_size' (64) * data-parallel size (3) = 192"));
  CHECK_THROWS_AS(r.validate_world(16), ConfigError);  // 64 * 16 > 512
  CHECK_THROWS_AS(r.validate_world(0), ConfigError);

  // global_batch_size 0: one micro-batch per rank per step, at any size.
  Recipe open = parse_recipe("{}");
  CHECK_NOTHROW(open.validate_world(7));
  CHECK(open.grad_accum_steps(7) == 1);
}

TEST_CASE("resolve_world fills dp_shard and checks the mesh", "[recipe]") {
  Recipe r = parse_recipe(R"({"train": {"micro_batch_size": 2, "global_batch_size": 16}})");
  Recipe four = r;
  four.resolve_world(4);
  CHECK(four.dist.dp_shard == 4);

  Recipe hsdp = parse_recipe(R"({"dist": {"dp_outer": 2}})");
  hsdp.resolve_world(4);
  CHECK(hsdp.dist.dp_shard == 2);

  Recipe odd = parse_recipe(R"({"dist": {"dp_outer": 2}})");
  CHECK_THROWS_WITH(odd.resolve_world(3), Catch::Contains("world size 3") &&
                                              Catch::Contains("dist.dp_outer"));
  Recipe fixed = parse_recipe(R"({"dist": {"dp_shard": 2}})");
  CHECK_THROWS_WITH(fixed.resolve_world(4), Catch::Contains("does not match the world size 4"));
  // The batch must split over the data-parallel ranks the world leaves.
  Recipe batch = r;
  CHECK_THROWS_WITH(batch.resolve_world(16), Catch::Contains("train.global_batch_size"));
}

TEST_CASE("resolve_device settles the auto choices", "[recipe]") {
  Recipe cpu = parse_recipe("{}");
  cpu.resolve_device(/*cuda_available=*/false);
  CHECK(cpu.dist.device == "cpu");
  CHECK(cpu.mixed_precision.compute_dtype == "f32");
  // f32 on the CPU reduces in f64: exact, so sharded runs equal a single process bitwise.
  CHECK(cpu.mixed_precision.grad_reduce_dtype == "f64");

  Recipe gpu = parse_recipe("{}");
  gpu.resolve_device(true);
  CHECK(gpu.dist.device == "cuda");
  CHECK(gpu.mixed_precision.compute_dtype == "bf16");
  CHECK(gpu.mixed_precision.grad_reduce_dtype == "f32");  // ddp.grad_reduce_in_fp32 defaults on

  Recipe narrow = parse_recipe("{}", {"ddp.grad_reduce_in_fp32=false"});
  narrow.resolve_device(true);
  CHECK(narrow.mixed_precision.grad_reduce_dtype == "bf16");

  Recipe f64 = parse_recipe("{}", {"mixed_precision.compute_dtype=f64"});
  f64.resolve_device(false);
  CHECK(f64.mixed_precision.grad_reduce_dtype == "f64");

  Recipe explicit_cpu = parse_recipe("{}", {"dist.device=cpu"});
  explicit_cpu.resolve_device(true);
  CHECK(explicit_cpu.dist.device == "cpu");
  CHECK(explicit_cpu.mixed_precision.compute_dtype == "f32");

  Recipe wants_gpu = parse_recipe("{}", {"dist.device=cuda"});
  CHECK_THROWS_WITH(wants_gpu.resolve_device(false),
                    Catch::Contains("'dist.device' is \"cuda\" but no CUDA device"));
}

TEST_CASE("the resolved recipe round-trips through JSON and a file", "[recipe]") {
  Recipe r = parse_recipe(R"({"model": {"family": "llama", "n_head": 8, "n_kv_head": 2,
                                        "d_model": 512},
                              "optimizer": {"lr": 1.2345678901234e-3},
                              "checkpoint": {"save": "somewhere", "load": null}})",
                          {"run.name=round trip"});
  std::string json = r.to_json_string();
  Recipe back = parse_recipe(json);
  CHECK(back.to_json_string() == json);
  CHECK(back.optimizer.lr == r.optimizer.lr);  // doubles are written exactly
  CHECK(back.model.d_ff == r.model.d_ff);
  CHECK_FALSE(back.checkpoint.load.has_value());
  CHECK(json.find("\"model\"") < json.find("\"optimizer\""));  // schema order

  std::string path = fsdp::testing::scratch_dir("recipe_roundtrip") + "/run_config.json";
  r.write_resolved(path);
  CHECK(load_recipe(path).to_json_string() == json);
  CHECK_THROWS_AS(r.write_resolved(path + ".missing_dir/x/run_config.json"), IoError);
}

TEST_CASE("load_recipe names a file it cannot open", "[recipe]") {
  // A configuration error (train exits 2, as its --help says), naming the file.
  CHECK_THROWS_WITH(load_recipe("no/such/recipe.json"),
                    Catch::Contains("recipe file 'no/such/recipe.json' does not exist"));
  CHECK_THROWS_AS(load_recipe("no/such/recipe.json"), ConfigError);
}

TEST_CASE("a failed write of the resolved recipe leaves the earlier file whole", "[recipe]") {
  const std::string dir = fsdp::testing::scratch_dir("recipe_atomic");
  const std::string path = dir + "/run_config.json";
  const Recipe r = parse_recipe("{}", {"run.name=first"});
  r.write_resolved(path);
  const std::string before = r.to_json_string();
  std::filesystem::create_directories(path + ".tmp");  // the temporary file cannot be made
  CHECK_THROWS_AS(parse_recipe("{}", {"run.name=second"}).write_resolved(path), IoError);
  CHECK(load_recipe(path).to_json_string() == before);
}

TEST_CASE("help text lists every key with its type, default and help", "[recipe]") {
  std::string help = recipe_help_text();
  REQUIRE(recipe_schema().size() > 60);
  for (const FieldSpec& spec : recipe_schema()) {
    INFO(spec.path);
    CHECK(help.find(spec.path + " ") != std::string::npos);
    CHECK_FALSE(spec.help.empty());
    CHECK(help.find(spec.help) != std::string::npos);
  }
  CHECK(help.find("optimizer.lr") != std::string::npos);
  CHECK(help.find("0.0003  (a number, >= 0)") != std::string::npos);
  CHECK(help.find("\"cosine\"  (one of \"constant\", \"linear\", \"cosine\", \"WSD\")") !=
        std::string::npos);
  CHECK(help.find("null  (a string or null)") != std::string::npos);
  CHECK(help.find("(a number, in [0, 1))") != std::string::npos);
}

TEST_CASE("schema keys are unique and sections are contiguous", "[recipe]") {
  std::set<std::string> paths, finished_sections;
  std::string section;
  for (const FieldSpec& spec : recipe_schema()) {
    CHECK(paths.insert(spec.path).second);
    if (spec.section() != section) {
      CHECK(finished_sections.count(spec.section()) == 0);
      finished_sections.insert(section);
      section = spec.section();
    }
  }
  const std::set<std::string> expected = {"model", "tokenizer", "dataset", "train", "optimizer",
                                          "scheduler", "mixed_precision", "ddp", "dist",
                                          "checkpoint", "logger", "run"};
  finished_sections.insert(section);
  finished_sections.erase("");
  CHECK(finished_sections == expected);
}

TEST_CASE("summary prints every key's resolved value", "[recipe]") {
  Recipe r = parse_recipe(R"({"model": {"d_model": 256, "n_head": 4}})", {"run.name=demo"});
  std::string s = r.summary();
  CHECK(s.find("model:\n") != std::string::npos);
  CHECK(s.find("optimizer:\n") != std::string::npos);
  CHECK(s.find("name") != std::string::npos);
  CHECK(s.find("demo\n") != std::string::npos);
  CHECK(s.find("d_ff") != std::string::npos);
  CHECK(s.find("1024\n") != std::string::npos);  // derived d_ff shown resolved
  size_t lines = 0;
  for (char c : s) lines += c == '\n';
  CHECK(lines == recipe_schema().size() + 12);  // one per key, one per section header
}
