// Resharding: a checkpoint saved with one world size and strategy loads into any other and
// training continues with the very losses the saving run had (exact on the CPU in fp32).
// Under mpirun -np 4: saved by 4 ranks under ZeRO-3 (and by 2 x 2 HSDP), resumed by 2 ranks
// under ZeRO-1 (each half of the world on its own) and by every rank alone (no_shard).
#include <cstring>
#include <memory>

#include "collectives/mesh.h"
#include "collectives/world.h"
#include "runtime/checkpoint/checkpoint_reader.h"
#include "runtime/checkpoint/load.h"
#include "runtime/checkpoint/save.h"
#include "runtime/parallel/data_parallel_groups.h"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/mpi_world.h"
#include "tests/test_support.h"

using namespace fsdp;
using testing::TinyTraining;

namespace {

void check_bitwise(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("step " << i << ": " << got[i] << " vs " << want[i]);
    CHECK(std::memcmp(&got[i], &want[i], sizeof(double)) == 0);
  }
}

checkpoint::TrainingProgress progress_at(int64_t step) {
  checkpoint::TrainingProgress p;
  p.step = step;
  p.consumed_samples = step * TinyTraining::kGlobalMicroBatches;
  return p;
}

// A group of `size` ranks out of the world (ranks [color*size, (color+1)*size)), with the
// communicators a sharded model and a checkpoint need. Collective over the world.
struct SubGroup {
  SubGroup(World& world, int size) {
    const int color = world.rank() / size;
    ckpt = world.split("sub/ckpt", color, world.rank());
    gather = world.split("sub/ag", color, world.rank());
    reduce = world.split("sub/rs", color, world.rank());
    rank = ckpt->rank();
  }
  DataParallelGroups sharded_over() const {
    DataParallelGroups g;
    if (gather->size() > 1) {
      g.shard_gather = gather.get();
      g.shard_reduce = reduce.get();
    }
    return g;
  }
  std::unique_ptr<Communicator> ckpt, gather, reduce;
  int rank = 0;
};

// Loads `dir` into a fresh run and trains steps [from, to).
std::vector<double> resume(TinyTraining& run, Communicator* comm, const std::string& dir, int64_t from,
                           int64_t to) {
  const checkpoint::CheckpointMetadata m =
      checkpoint::load_checkpoint(run.ctx, comm, *run.sharded, run.optimizer.get(), dir);
  CHECK(m.step == from);
  CHECK(run.optimizer->steps_taken() == from);
  return run.train(from, to);
}

}  // namespace

TEST_CASE("a checkpoint saved by N ranks under ZeRO-3 resumes on N/2 ranks under ZeRO-1 and on one process",
          "[checkpoint][mpi]") {
  testing::MpiWorld w;
  const int n = w.size();
  const std::string dir = testing::shared_scratch_dir("reshard");
  for (bool llama : {false, true}) {
    INFO((llama ? "llama" : "gpt2") << ", saved by " << n << " ranks");
    const std::string save_dir = dir + (llama ? "/llama" : "/gpt2");
    std::vector<double> want;
    {
      const ShardingStrategy s = ShardingStrategy::OptimGradsParams;
      TinyTraining run(s, w.groups(s), w.rank(), n, llama);
      run.train(0, 4);
      checkpoint::save_checkpoint(run.ctx, &w.world.comm(), *run.sharded, run.optimizer.get(), run.groups,
                                  progress_at(4), save_dir);
      want = run.train(4, 8);
    }
    CHECK(want.back() < want.front());
    const std::string ckpt = checkpoint::find_checkpoint(save_dir);
    REQUIRE(ckpt == save_dir + "/step_000004");
    {
      // Saved by ZeRO-3 over n ranks: one file per rank. A reader of a range opens only the
      // files holding it and reads only its bytes.
      checkpoint::CheckpointReader reader(ckpt);
      CHECK(reader.metadata().files.size() == size_t(n));
      CHECK(reader.metadata().shard_size == n);
      CHECK(reader.metadata().strategy == "optim_grads_params");
      const checkpoint::ParamRecord& wte = *reader.metadata().find_param(llama ? "embed.weight" : "wte.weight");
      const checkpoint::ParamPiece& last = wte.pieces.back();
      std::vector<float> part(size_t(last.numel));
      reader.read(checkpoint::kExpAvg, wte.name, last.param_offset, last.numel, part.data());
      CHECK(reader.files_opened() == 1);
      CHECK(reader.bytes_read() == uint64_t(last.numel) * 4);
    }

    // Half the world, ZeRO-1 (under -np 2 each half is one rank).
    {
      SubGroup half(w.world, std::max(1, n / 2));
      TinyTraining run(ShardingStrategy::Optim, half.sharded_over(), half.rank, half.ckpt->size(), llama);
      check_bitwise(resume(run, half.ckpt.get(), ckpt, 4, 8), want);
    }
    // Every rank on its own, no_shard.
    {
      TinyTraining run(ShardingStrategy::NoShard, DataParallelGroups(), 0, 1, llama);
      check_bitwise(resume(run, nullptr, ckpt, 4, 8), want);
    }
  }
}

TEST_CASE("replicated state (no_shard, HSDP) is written once per shard and loads into any layout",
          "[checkpoint][mpi]") {
  World world(testing::quiet_mpi_world());
  const int n = world.size();
  const std::string dir = testing::shared_scratch_dir("replicas");
  struct Layout {
    const char* name;
    MeshSizes mesh;
    ShardingStrategy strategy;
    size_t files;
  };
  std::vector<Layout> layouts = {{"no_shard", {1, n, 1, 1, 1}, ShardingStrategy::NoShard, 1}};
  if (n == 4) layouts.push_back({"HSDP 2x2 ZeRO-3", {2, 2, 1, 1, 1}, ShardingStrategy::OptimGradsParams, 2});
  for (const Layout& l : layouts) {
    INFO(l.name);
    const std::string save_dir = dir + "/" + std::to_string(l.files);
    Mesh mesh(l.mesh, n);
    MeshCommunicators comms(world, mesh);
    std::vector<double> want;
    {
      TinyTraining run(l.strategy, data_parallel_groups(comms, l.strategy), world.rank(), n);
      run.train(0, 3);
      checkpoint::save_checkpoint(run.ctx, &world.comm(), *run.sharded, run.optimizer.get(), run.groups,
                                  progress_at(3), save_dir);
      want = run.train(3, 6);
    }
    const std::string ckpt = checkpoint::find_checkpoint(save_dir);
    {
      checkpoint::CheckpointReader reader(ckpt);
      CHECK(reader.metadata().files.size() == l.files);
    }
    // Back into n ranks under ZeRO-3 (the world's own communicators).
    {
      Mesh flat({1, n, 1, 1, 1}, n);
      MeshCommunicators flat_comms(world, flat);
      const ShardingStrategy s = ShardingStrategy::OptimGradsParams;
      TinyTraining run(s, data_parallel_groups(flat_comms, s), world.rank(), n);
      check_bitwise(resume(run, &world.comm(), ckpt, 3, 6), want);
    }
  }
}
