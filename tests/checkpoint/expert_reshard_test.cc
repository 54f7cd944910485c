// Checkpoints under expert parallelism: each MoE layer's experts are split over the
// expert-parallel ranks and sharded over the ranks that hold the same ones, and a checkpoint
// stores them by global expert index.
//
// Under mpirun -np 2 / -np 4 a tiny MoE model (a Mixtral) trained at EP2 with ZeRO-3 over
// the experts' own group saves; then, one after the other, each layout loads the previous
// one's checkpoint and saves again: EP1 ZeRO-1, EP2 no_shard (the first replica of each
// expert-parallel rank's experts writes them: two files, one with the dense units), EP =
// world size ZeRO-3 (the experts' group of one rank), HSDP 2 x EP2 (np4), and one process.
// Every re-save holds every parameter's master weights and both Adam moments bit for bit as
// the first, read by global coordinates, and the model's buffers (expert biases) ride along
// in rank 0's file. The Mixtral export of the EP2 checkpoint equals the export of its EP1
// copy. A checkpoint of format version 3 (before expert parallelism) still loads, at EP2
// too. A checkpoint after training steps that lacks a buffer the model has is refused
// naming it, the model untouched; one of step 0 leaves the buffer as it was.
#include <cstring>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "collectives/mesh.h"
#include "collectives/world.h"
#include "kernels/ops.h"
#include "runtime/checkpoint/checkpoint_reader.h"
#include "runtime/checkpoint/durable_files.h"
#include "runtime/checkpoint/load.h"
#include "runtime/checkpoint/save.h"
#include "runtime/checkpoint/sha256.h"
#include "runtime/parallel/data_parallel_groups.h"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/mpi_world.h"
#include "tests/test_support.h"
#include "tools/convert/hf_export.h"
#include "tools/convert/hf_import.h"

using namespace fsdp;
using Catch::Matchers::Contains;
using testing::TinyTraining;
using Json = nlohmann::ordered_json;

namespace {

constexpr const char* kBias = "layers.0.mlp.expert_bias";
const std::vector<float> kBiasValues = {0.25f, -0.5f, 1.0f, 2.0f};

checkpoint::TrainingProgress progress_at(int64_t step) {
  checkpoint::TrainingProgress p;
  p.step = step;
  p.consumed_samples = step * TinyTraining::kGlobalMicroBatches;
  p.recipe_json = convert::recipe_json_for(testing::tiny_moe_config());  // for the export
  return p;
}

struct Layout {
  std::string name;
  MeshSizes mesh;  // dp_outer, dp_shard, cp, ep, tp
  ShardingStrategy strategy;
};

// The tiny MoE model trained at `layout` over the whole world, every rank on its own data.
struct MoeRun {
  MoeRun(World& world, const Layout& layout)
      : mesh(layout.mesh, world.size()),
        comms(world, mesh),
        run(testing::tiny_moe_config(), layout.strategy, data_parallel_groups(comms, layout.strategy),
            world.rank(), world.size(), &comms.axis(MeshAxis::ep)) {}
  Mesh mesh;
  MeshCommunicators comms;
  TinyTraining run;
};

// Every parameter's state kinds and every buffer of checkpoint `dir`, read by global
// coordinates: "<kind>/<name>" -> bytes.
std::map<std::string, std::string> global_state(const std::string& dir) {
  Context ctx;
  checkpoint::CheckpointReader reader(dir);
  std::map<std::string, std::string> out;
  auto bytes = [](const Tensor& t) {
    return std::string(static_cast<const char*>(t.data_ptr()), size_t(t.nbytes()));
  };
  for (const checkpoint::ParamRecord& p : reader.metadata().params)
    for (const std::string& kind : reader.metadata().state_kinds())
      out[kind + "/" + p.name] = bytes(reader.read_parameter(ctx, kind, p.name));
  for (const checkpoint::BufferRecord& b : reader.metadata().buffers)
    out["buffer/" + b.name] = bytes(reader.read_buffer(ctx, b.name));
  return out;
}

void check_same_state(const std::string& got, const std::string& want) {
  const std::map<std::string, std::string> a = global_state(got), b = global_state(want);
  REQUIRE(a.size() == b.size());
  for (const auto& [key, value] : b) {
    INFO(key);
    REQUIRE(a.count(key));
    CHECK(a.at(key) == value);
  }
}

// Loads `from` into `run` (with the bias buffer), checks what came back, and saves it at
// step 2 into save_dir. Collective over `comm`.
std::string load_and_save_again(TinyTraining& run, Communicator* comm, const std::string& from,
                                const std::string& save_dir) {
  Tensor bias = ops::zeros(run.ctx, Shape{4}, DType::f32);
  checkpoint::LoadOptions lo;
  lo.buffers = {{kBias, bias}};
  const checkpoint::CheckpointMetadata m =
      checkpoint::load_checkpoint(run.ctx, comm, *run.sharded, run.optimizer.get(), from, lo);
  CHECK(m.step == 2);
  CHECK(run.optimizer->steps_taken() == 2);
  CHECK(ops::to_vector<float>(run.ctx, bias) == kBiasValues);
  checkpoint::SaveOptions so;
  so.buffers = {{kBias, bias}};
  checkpoint::save_checkpoint(run.ctx, comm, *run.sharded, run.optimizer.get(), run.groups, progress_at(2),
                              save_dir, so);
  return checkpoint::find_checkpoint(save_dir);
}

size_t files_holding(const checkpoint::CheckpointMetadata& m, const std::string& tensor) {
  size_t n = 0;
  for (const checkpoint::FileRecord& f : m.files) n += f.find_tensor(tensor) != nullptr;
  return n;
}

// The metadata of `dir` rewritten as format version 3 wrote it (no expert parallelism, no
// buffers), its checksum made to match.
void rewrite_as_version_3(const std::string& dir) {
  const std::string path = dir + "/metadata.json";
  Json j = Json::parse(checkpoint::read_text_file(path));
  j["version"] = 3;
  j["layout"].erase("expert_parallel");
  j["layout"].erase("expert_shard_size");
  for (Json& u : j["layout"]["units"]) u.erase("experts");
  for (Json& f : j["files"]) {
    f.erase("ep_rank");
    f.erase("expert_shard_rank");
  }
  j.erase("buffers");
  j.erase("metadata_sha256");
  j["metadata_sha256"] = checkpoint::sha256_hex(j.dump(1));
  checkpoint::write_file_atomically(path, j.dump(1) + "\n");
}

}  // namespace

TEST_CASE("experts saved split over expert-parallel ranks load at every expert-parallel layout",
          "[checkpoint][mpi][moe]") {
  World world(testing::quiet_mpi_world());
  const int n = world.size();
  if (n < 2 || n % 2 != 0) return;  // expert parallelism needs ranks to split over
  const std::string dir = testing::shared_scratch_dir("expert_reshard");
  const Layout saving{"ep2_zero3", {1, n / 2, 1, 2, 1}, ShardingStrategy::OptimGradsParams};
  {
    MoeRun r(world, saving);
    r.run.train(0, 2);
    checkpoint::SaveOptions so;
    so.buffers = {{kBias, ops::from_host<float>(r.run.ctx, kBiasValues, Shape{4})}};
    checkpoint::save_checkpoint(r.run.ctx, &world.comm(), *r.run.sharded, r.run.optimizer.get(),
                                r.run.groups, progress_at(2), dir + "/" + saving.name, so);
  }
  const std::string first = checkpoint::find_checkpoint(dir + "/" + saving.name);
  REQUIRE(!first.empty());
  {
    // One file per rank; each experts unit sharded over n / 2 ranks; each expert parameter's
    // slices by global expert index; the bias in rank 0's file.
    checkpoint::CheckpointReader reader(first);
    const checkpoint::CheckpointMetadata& m = reader.metadata();
    CHECK(m.files.size() == size_t(n));
    CHECK(m.expert_parallel == 2);
    CHECK(m.expert_shard_size == n / 2);
    CHECK(m.shard_size == n);
    int experts_units = 0;
    for (const checkpoint::UnitRecord& u : m.units) experts_units += u.experts;
    CHECK(experts_units == 2);
    const checkpoint::ParamRecord* gate_up = m.find_param("layers.1.mlp.experts.gate_up");
    REQUIRE(gate_up != nullptr);
    CHECK(gate_up->unit == "layers.1.experts");
    CHECK(gate_up->shape == Shape({4, 48, 32}));
    REQUIRE(gate_up->ep_slices.size() == 2);
    CHECK(gate_up->ep_slices[0].ranges == std::vector<std::pair<int64_t, int64_t>>{{0, 2}});
    CHECK(gate_up->ep_slices[1].ranges == std::vector<std::pair<int64_t, int64_t>>{{2, 4}});
    CHECK(gate_up->tp_slices.empty());
    REQUIRE(m.find_buffer(kBias) != nullptr);
    CHECK(m.files[size_t(m.find_buffer(kBias)->file)].name == checkpoint::shard_file_name(0, n));
  }

  std::vector<Layout> layouts = {
      {"ep1_zero1", {1, n, 1, 1, 1}, ShardingStrategy::Optim},
      {"ep2_no_shard", {1, n / 2, 1, 2, 1}, ShardingStrategy::NoShard},
      {"ep" + std::to_string(n) + "_zero3", {1, 1, 1, n, 1}, ShardingStrategy::OptimGradsParams}};
  if (n == 4) layouts.push_back({"hsdp2_ep2_zero3", {2, 1, 1, 2, 1}, ShardingStrategy::OptimGradsParams});
  std::string previous = first;
  for (const Layout& layout : layouts) {
    INFO("loaded at " << layout.name << " from " << previous);
    std::string saved;
    {
      MoeRun r(world, layout);
      saved = load_and_save_again(r.run, &world.comm(), previous, dir + "/" + layout.name);
    }
    check_same_state(saved, first);
    if (layout.name == "ep2_no_shard") {
      // The first replica of each expert-parallel rank's experts writes them; one of those
      // files also holds the dense units.
      checkpoint::CheckpointReader reader(saved);
      CHECK(reader.metadata().files.size() == 2);
      CHECK(files_holding(reader.metadata(), "main/layers.0.experts") == 2);
      CHECK(files_holding(reader.metadata(), "main/root") == 1);
    }
    previous = saved;
  }
  // One process, without expert parallelism.
  if (world.rank() == 0) {
    TinyTraining alone(testing::tiny_moe_config(), ShardingStrategy::NoShard, DataParallelGroups(), 0, 1);
    check_same_state(load_and_save_again(alone, nullptr, previous, dir + "/alone"), first);
  }
  testing::barrier_all_ranks();

  // The Mixtral export of the EP2 checkpoint is that of its EP1 copy, byte for byte.
  if (world.rank() == 0) {
    convert::ExportOptions o;
    o.check_batch = false;
    convert::export_hf(first, dir + "/hf_ep2", o);
    convert::export_hf(dir + "/ep1_zero1", dir + "/hf_ep1", o);
    for (const char* file : {"/model.safetensors", "/config.json"}) {
      INFO(file);
      CHECK(checkpoint::sha256_hex(checkpoint::read_text_file(dir + "/hf_ep2" + file)) ==
            checkpoint::sha256_hex(checkpoint::read_text_file(dir + "/hf_ep1" + file)));
    }
  }
  testing::barrier_all_ranks();
}

TEST_CASE("a checkpoint of format version 3 (before expert parallelism) still loads, at EP2 too",
          "[checkpoint][mpi][moe]") {
  World world(testing::quiet_mpi_world());
  const int n = world.size();
  const std::string dir = testing::shared_scratch_dir("version_3");
  {
    MoeRun r(world, {"flat", {1, n, 1, 1, 1}, ShardingStrategy::OptimGradsParams});
    r.run.train(0, 2);
    checkpoint::save_checkpoint(r.run.ctx, &world.comm(), *r.run.sharded, r.run.optimizer.get(),
                                r.run.groups, progress_at(2), dir + "/v3");
  }
  const std::string v3 = dir + "/v3/step_000002";
  const std::map<std::string, std::string> want = global_state(v3);
  testing::barrier_all_ranks();  // every rank has read it before it is rewritten
  if (world.rank() == 0) rewrite_as_version_3(v3);
  testing::barrier_all_ranks();
  CHECK(checkpoint::CheckpointReader(v3).metadata().version == 3);
  CHECK(global_state(v3) == want);

  const Layout into = n % 2 == 0 ? Layout{"ep2", {1, n / 2, 1, 2, 1}, ShardingStrategy::Optim}
                                 : Layout{"flat", {1, n, 1, 1, 1}, ShardingStrategy::Optim};
  MoeRun r(world, into);
  checkpoint::load_checkpoint(r.run.ctx, &world.comm(), *r.run.sharded, r.run.optimizer.get(), v3);
  checkpoint::save_checkpoint(r.run.ctx, &world.comm(), *r.run.sharded, r.run.optimizer.get(), r.run.groups,
                              progress_at(2), dir + "/again");
  CHECK(global_state(dir + "/again/step_000002") == want);
}

TEST_CASE("a checkpoint after training steps without a buffer the model has is refused naming it",
          "[checkpoint][mpi][moe]") {
  testing::MpiWorld w;
  const std::string dir = testing::shared_scratch_dir("buffers");
  const ShardingStrategy s = ShardingStrategy::OptimGradsParams;
  TinyTraining run(testing::tiny_moe_config(), s, w.groups(s), w.rank(), w.size());
  checkpoint::TrainingProgress at0 = progress_at(0);
  checkpoint::save_checkpoint(run.ctx, &w.world.comm(), *run.sharded, run.optimizer.get(), run.groups, at0,
                              dir + "/step0");
  run.train(0, 2);
  checkpoint::save_checkpoint(run.ctx, &w.world.comm(), *run.sharded, run.optimizer.get(), run.groups,
                              progress_at(2), dir + "/step2");
  run.train(2, 3);

  const std::vector<uint8_t> before = run.state_bytes();
  Tensor bias = ops::from_host<float>(run.ctx, kBiasValues, Shape{4});
  checkpoint::LoadOptions lo;
  lo.buffers = {{kBias, bias}};
  CHECK_THROWS_AS(checkpoint::load_checkpoint(run.ctx, &w.world.comm(), *run.sharded, run.optimizer.get(),
                                              dir + "/step2/step_000002", lo),
                  CheckpointError);
  CHECK_THROWS_WITH(checkpoint::load_checkpoint(run.ctx, &w.world.comm(), *run.sharded, run.optimizer.get(),
                                                dir + "/step2/step_000002", lo),
                    Contains("holds no buffer \"layers.0.mlp.expert_bias\"") && Contains("2 steps"));
  CHECK(run.state_bytes() == before);
  CHECK(ops::to_vector<float>(run.ctx, bias) == kBiasValues);

  // Step 0 (initial weights, an import): the buffer keeps its value.
  checkpoint::load_checkpoint(run.ctx, &w.world.comm(), *run.sharded, run.optimizer.get(),
                              dir + "/step0/step_000000", lo);
  CHECK(ops::to_vector<float>(run.ctx, bias) == kBiasValues);

  // A buffer of another shape does not fit.
  checkpoint::SaveOptions so;
  so.buffers = {{kBias, bias}};
  checkpoint::save_checkpoint(run.ctx, &w.world.comm(), *run.sharded, run.optimizer.get(), run.groups,
                              progress_at(3), dir + "/step3", so);
  checkpoint::LoadOptions wider;
  wider.buffers = {{kBias, ops::zeros(run.ctx, Shape{8}, DType::f32)}};
  CHECK_THROWS_WITH(checkpoint::load_checkpoint(run.ctx, &w.world.comm(), *run.sharded, run.optimizer.get(),
                                                dir + "/step3/step_000003", wider),
                    Contains("buffer \"layers.0.mlp.expert_bias\" is (4,) in the checkpoint but (8,) in the model"));
}
