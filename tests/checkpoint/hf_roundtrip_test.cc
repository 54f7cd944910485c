// Hugging Face export and import. A tiny GPT-2 and a tiny Llama are trained and saved
// sharded by every rank (ZeRO-3); rank 0 exports the checkpoint (reading every rank's
// shards) and checks the directory against the Hugging Face layout (names, Conv1D
// transposes, q/k/v and gate/up splits, vocabulary rows, config.json, metadata); importing
// it gives back the same weights bit for bit (padding rows of the vocabulary aside, which an
// export drops and an import zeroes), as a step-0 checkpoint that loads into any layout.
// Damaged Hugging Face directories are refused naming the tensor or key.
#include <cstring>
#include <cmath>
#include <filesystem>
#include <functional>
#include <set>

#include <nlohmann/json.hpp>

#include "collectives/mesh.h"
#include "collectives/world.h"
#include "kernels/ops.h"
#include "runtime/checkpoint/checkpoint_reader.h"
#include "runtime/checkpoint/durable_files.h"
#include "runtime/checkpoint/load.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/checkpoint/save.h"
#include "runtime/parallel/data_parallel_groups.h"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/mpi_world.h"
#include "tests/test_support.h"
#include "tools/convert/hf_export.h"
#include "tools/convert/hf_format.h"
#include "tools/convert/hf_import.h"

using namespace fsdp;
using testing::TinyTraining;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

// Every parameter's full weights, gathered from the sharded model (collective).
std::map<std::string, Tensor> gather_weights(TinyTraining& run) {
  std::map<std::string, Tensor> out;
  for (int u = 0; u < run.sharded->num_units(); ++u) {
    const UnitPlan& plan = run.sharded->plan().units()[size_t(u)];
    Tensor full = run.ctx.empty(Shape{plan.padded_numel}, DType::f32);
    run.sharded->gather_full_weights(u, full);
    for (const ParamPlacement& p : plan.params)
      out[p.name] = ops::clone(run.ctx, full.narrow(0, p.offset, p.numel).view(p.shape));
  }
  return out;
}

bool rows_equal(const Tensor& a, const Tensor& b, int64_t rows) {
  const int64_t n = rows * (a.numel() / a.size(0));
  return std::memcmp(a.data_ptr(), b.data_ptr(), size_t(n) * 4) == 0;
}

bool all_zero(const Tensor& t, int64_t from_row) {
  const int64_t cols = t.numel() / t.size(0);
  const float* p = t.data<float>();
  for (int64_t i = from_row * cols; i < t.numel(); ++i)
    if (p[i] != 0.0f) return false;
  return true;
}

// Our weights equal `want`'s, except the vocabulary's padding rows, which are zero.
void check_same_weights(const std::map<std::string, Tensor>& got, const std::map<std::string, Tensor>& want,
                        const models::ModelConfig& c) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, w] : want) {
    INFO(name);
    REQUIRE(got.count(name));
    const Tensor& g = got.at(name);
    REQUIRE(g.shape() == w.shape());
    const bool vocab = name == "wte.weight" || name == "embed.weight" || name == "lm_head.weight";
    CHECK(rows_equal(g, w, vocab ? c.vocab_size : w.size(0)));
    if (vocab) CHECK(all_zero(g, c.vocab_size));
  }
}

float at(const Tensor& t, int64_t i, int64_t j) { return t.data<float>()[i * t.size(1) + j]; }

}  // namespace

TEST_CASE("a sharded checkpoint exports to the Hugging Face layout and imports back to the same weights",
          "[checkpoint][mpi]") {
  World world(testing::quiet_mpi_world());
  const int n = world.size();
  Mesh mesh({1, n, 1, 1, 1}, n);
  MeshCommunicators comms(world, mesh);
  const std::string dir = testing::shared_scratch_dir("hf");
  const ShardingStrategy s = ShardingStrategy::OptimGradsParams;

  for (bool llama : {false, true}) {
    INFO((llama ? "llama" : "gpt2") << ", " << n << " ranks");
    const models::ModelConfig c = testing::tiny_model_config(llama);
    const std::string base = dir + (llama ? "/llama" : "/gpt2");
    TinyTraining run(s, data_parallel_groups(comms, s), world.rank(), n, llama);
    run.train(0, 2);
    checkpoint::TrainingProgress progress;
    progress.step = 2;
    progress.recipe_json = convert::recipe_json_for(c);
    checkpoint::save_checkpoint(run.ctx, &world.comm(), *run.sharded, run.optimizer.get(), run.groups,
                                progress, base + "/native");
    const std::map<std::string, Tensor> trained = gather_weights(run);

    if (world.rank() == 0) {
      const models::ModelConfig exported = convert::export_hf(base + "/native", base + "/hf");
      CHECK(exported.str() == c.str());

      // config.json describes the same model.
      const std::string config_text = checkpoint::read_text_file(base + "/hf/config.json");
      CHECK(convert::model_config_from_hf(config_text, "config.json").str() == c.str());
      const Json config = Json::parse(config_text);
      CHECK(config["model_type"] == (llama ? "llama" : "gpt2"));
      CHECK(config["architectures"][0] == (llama ? "LlamaForCausalLM" : "GPT2LMHeadModel"));
      CHECK(config["vocab_size"] == 96);

      // model.safetensors: Hugging Face's names and layouts.
      Context ctx;
      checkpoint::SafetensorsReader hf(base + "/hf/model.safetensors");
      CHECK(hf.metadata().at("format") == "pt");
      std::set<std::string> names;
      for (const auto& e : hf.entries()) names.insert(e.name);
      std::set<std::string> expected;
      for (const convert::HfTensor& t : convert::hf_tensors(c)) expected.insert(t.name);
      CHECK(names == expected);
      CHECK(names.size() == (llama ? 1 + 9 * 2 + 1 + 1 : 2 + 12 * 2 + 2));
      if (!llama) {
        CHECK_FALSE(names.count("lm_head.weight"));  // tied to wte
        const Tensor c_attn = hf.load(ctx, "transformer.h.1.attn.c_attn.weight");
        const Tensor& qkv = trained.at("h.1.attn.qkv.weight");  // (3C, C)
        REQUIRE(c_attn.shape() == Shape({32, 96}));
        for (int64_t i = 0; i < 32; ++i)
          for (int64_t j = 0; j < 96; ++j) REQUIRE(at(c_attn, i, j) == at(qkv, j, i));
        CHECK(hf.entry("transformer.wte.weight").shape == Shape({96, 32}));
        CHECK(hf.entry("transformer.h.0.mlp.c_fc.weight").shape == Shape({32, 128}));
        CHECK(hf.entry("transformer.h.0.mlp.c_proj.weight").shape == Shape({128, 32}));
      } else {
        const Tensor& qkv = trained.at("layers.1.attn.qkv.weight");  // ((4 + 2 * 2) * 8, 32)
        const Tensor k = hf.load(ctx, "model.layers.1.self_attn.k_proj.weight");
        REQUIRE(k.shape() == Shape({16, 32}));
        for (int64_t i = 0; i < 16; ++i)
          for (int64_t j = 0; j < 32; ++j) REQUIRE(at(k, i, j) == at(qkv, 32 + i, j));
        const Tensor& gate_up = trained.at("layers.0.mlp.gate_up.weight");  // (2F, C)
        const Tensor up = hf.load(ctx, "model.layers.0.mlp.up_proj.weight");
        const int64_t F = c.d_ff;
        REQUIRE(up.shape() == Shape({F, 32}));
        for (int64_t i = 0; i < F; ++i) REQUIRE(at(up, i, 5) == at(gate_up, F + i, 5));
        CHECK(hf.entry("lm_head.weight").shape == Shape({96, 32}));
        CHECK(hf.entry("model.layers.0.self_attn.q_proj.weight").shape == Shape({32, 32}));
        CHECK(hf.entry("model.layers.0.mlp.down_proj.weight").shape == Shape({32, F}));
      }

      // The check batch: ids in the vocabulary, our logits over it.
      checkpoint::SafetensorsReader batch(base + "/hf/fsdp_check_batch.safetensors");
      CHECK(batch.entry("input_ids").dtype == DType::i64);
      CHECK(batch.entry("logits").shape == Shape({2, 16, 96}));

      // Import: the same weights; then a step-0 checkpoint of them.
      const convert::HfModel imported = convert::read_hf_model(ctx, base + "/hf");
      CHECK(imported.config.str() == c.str());
      check_same_weights(imported.params, trained, c);
      convert::write_step0_checkpoint(ctx, imported, base + "/imported");
      CHECK(checkpoint::read_latest_marker(base + "/imported") == "step_000000");
    }
    testing::barrier_all_ranks();

    // The step-0 checkpoint loads into n ranks under ZeRO-1, weights only: fresh optimizer.
    TinyTraining again(ShardingStrategy::Optim, data_parallel_groups(comms, ShardingStrategy::Optim),
                       world.rank(), n, llama);
    again.train(0, 1);  // moments and a step count that the load must reset
    const checkpoint::CheckpointMetadata m = checkpoint::load_checkpoint(
        again.ctx, &world.comm(), *again.sharded, again.optimizer.get(), checkpoint::find_checkpoint(base + "/imported"));
    CHECK(m.step == 0);
    CHECK(m.optimizer == "none");
    CHECK(again.optimizer->steps_taken() == 0);
    for (size_t i = 0; i < again.optimizer->ranges().size(); ++i)
      CHECK(ops::item(again.ctx, ops::max_abs(again.ctx, again.optimizer->exp_avg(i))) == 0.0);
    check_same_weights(gather_weights(again), trained, c);
  }
}

TEST_CASE("importing a damaged or unsupported Hugging Face directory is refused, naming the problem",
          "[checkpoint]") {
  // Every rank works in a directory of its own.
  const std::string dir = testing::shared_scratch_dir("hf_bad") + "/rank" + std::to_string(testing::world_rank());
  Context ctx;
  const models::ModelConfig c = testing::tiny_model_config(false);
  // A valid export to damage: written from an untrained model's step-0 checkpoint.
  {
    convert::HfModel m;
    m.config = c;
    TinyTraining run(ShardingStrategy::NoShard, DataParallelGroups(), 0, 1);
    m.params = gather_weights(run);
    convert::write_step0_checkpoint(ctx, m, dir + "/native");
    convert::ExportOptions o;
    o.check_batch = false;
    convert::export_hf(dir + "/native", dir + "/good", o);
  }
  auto damaged = [&](const std::string& name, const std::function<void(const std::string&)>& edit) {
    const std::string d = dir + "/" + name;
    fs::copy(dir + "/good", d, fs::copy_options::recursive);
    edit(d);
    return d;
  };
  auto rewrite = [&](const std::string& d, const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
    std::vector<std::pair<std::string, Tensor>> ts;
    {
      checkpoint::SafetensorsReader r(d + "/model.safetensors");
      for (const auto& e : r.entries()) ts.emplace_back(e.name, r.load(ctx, e.name));
    }
    edit(ts);
    checkpoint::save_safetensors(ctx, d + "/model.safetensors", ts, {{"format", "pt"}});
  };

  const std::string missing = damaged("missing", [&](const std::string& d) {
    rewrite(d, [](auto& ts) { ts.erase(ts.begin() + 3); });
  });
  CHECK_THROWS_WITH(convert::read_hf_model(ctx, missing), Contains("is missing"));
  const std::string extra = damaged("extra", [&](const std::string& d) {
    rewrite(d, [&](auto& ts) { ts.emplace_back("transformer.h.9.attn.c_attn.weight", ctx.empty_host(Shape{2}, DType::f32)); });
  });
  CHECK_THROWS_WITH(convert::read_hf_model(ctx, extra), Contains("\"transformer.h.9.attn.c_attn.weight\" is not part of"));
  const std::string shaped = damaged("shaped", [&](const std::string& d) {
    rewrite(d, [&](auto& ts) {
      for (auto& t : ts)
        if (t.first == "transformer.wpe.weight") t.second = t.second.narrow(0, 0, 8);
    });
  });
  CHECK_THROWS_WITH(convert::read_hf_model(ctx, shaped), Contains("\"transformer.wpe.weight\" is (8, 32), expected (16, 32)"));
  const std::string relu = damaged("relu", [&](const std::string& d) {
    Json j = Json::parse(checkpoint::read_text_file(d + "/config.json"));
    j["activation_function"] = "relu";
    checkpoint::write_file_atomically(d + "/config.json", j.dump());
  });
  CHECK_THROWS_AS(convert::read_hf_model(ctx, relu), ConfigError);
  CHECK_THROWS_WITH(convert::read_hf_model(ctx, relu), Contains("activation_function"));

  // A NaN weight is refused by name, before anything is written.
  const std::string nan = damaged("nan", [&](const std::string& d) {
    rewrite(d, [&](auto& ts) {
      for (auto& t : ts)
        if (t.first == "transformer.wpe.weight") t.second.template data<float>()[5] = NAN;
    });
  });
  CHECK_THROWS_WITH(convert::read_hf_model(ctx, nan),
                    Contains("\"transformer.wpe.weight\" holds NaN or infinite values"));
  // A config.json asking for a billion layers is refused by name, at once.
  const std::string deep = damaged("deep", [&](const std::string& d) {
    Json j = Json::parse(checkpoint::read_text_file(d + "/config.json"));
    j["n_layer"] = 1000000000;
    checkpoint::write_file_atomically(d + "/config.json", j.dump());
  });
  CHECK_THROWS_WITH(convert::read_hf_model(ctx, deep), Contains("model.n_layer"));
  // A config.json claiming a vocabulary the files do not hold is refused by tensor and file
  // before anything is allocated (here 128 GiB, which the import used to try to allocate).
  const std::string vocab = damaged("vocab", [&](const std::string& d) {
    Json j = Json::parse(checkpoint::read_text_file(d + "/config.json"));
    j["vocab_size"] = int64_t(1) << 30;
    checkpoint::write_file_atomically(d + "/config.json", j.dump());
  });
  CHECK_THROWS_AS(convert::read_hf_model(ctx, vocab), CheckpointError);
  CHECK_THROWS_WITH(convert::read_hf_model(ctx, vocab),
                    Contains(vocab + "/model.safetensors: tensor \"transformer.wte.weight\" is (96, 32), "
                             "expected (1073741824, 32) from " + vocab + "/config.json"));
  // A config.json nested thousands of levels deep is refused before it is parsed.
  const std::string nested = damaged("nested", [&](const std::string& d) {
    std::string text = checkpoint::read_text_file(d + "/config.json");
    text.insert(1, "\"x\": " + std::string(10000, '[') + std::string(10000, ']') + ",");
    checkpoint::write_file_atomically(d + "/config.json", text);
  });
  CHECK_THROWS_WITH(convert::read_hf_model(ctx, nested),
                    Contains(nested + "/config.json:1:") && Contains("JSON nested deeper than 128 levels"));

  // Export never overwrites a non-empty directory; import never into one that holds
  // checkpoints (its `latest` would move back to step 0).
  const std::string config_before = checkpoint::read_text_file(dir + "/good/config.json");
  convert::ExportOptions o;
  o.check_batch = false;
  CHECK_THROWS_WITH(convert::export_hf(dir + "/native", dir + "/good", o), Contains("not an empty directory"));
  CHECK(checkpoint::read_text_file(dir + "/good/config.json") == config_before);
  const convert::HfModel good = convert::read_hf_model(ctx, dir + "/good");
  CHECK_THROWS_WITH(convert::write_step0_checkpoint(ctx, good, dir + "/native"),
                    Contains("holds checkpoints already"));
  CHECK(checkpoint::read_latest_marker(dir + "/native") == "step_000000");

  // A GPT-2 checkpoint saved without the "transformer." prefix (as OpenAI's) imports too.
  const std::string bare = damaged("bare", [&](const std::string& d) {
    rewrite(d, [](auto& ts) {
      for (auto& t : ts) t.first = t.first.substr(std::string("transformer.").size());
    });
  });
  const convert::HfModel a = convert::read_hf_model(ctx, bare), b = convert::read_hf_model(ctx, dir + "/good");
  for (const auto& [name, t] : b.params) CHECK(rows_equal(a.params.at(name), t, t.size(0)));
}
