// Strict loads and safe saves. A damaged checkpoint (truncated, bit-flipped or missing shard
// file; missing, extra or mis-shaped tensors or parameters; bad metadata) stops the load with
// a CheckpointError naming the file and the tensor or parameter, on every rank, and leaves
// both the model and the checkpoint directory exactly as they were. A save that fails on one
// rank midway leaves `latest` at the previous complete checkpoint, which still loads; the
// next save clears the debris. Run plainly and under mpirun -np 2 / -np 4 (the checksums are
// then verified by several ranks, and one rank's failure must reach the others).
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include <nlohmann/json.hpp>

#include "collectives/mesh.h"
#include "collectives/world.h"
#include "runtime/checkpoint/checkpoint_reader.h"
#include "runtime/checkpoint/durable_files.h"
#include "runtime/checkpoint/load.h"
#include "runtime/checkpoint/safetensors.h"
#include "tests/checkpoint/damage.h"
#include "runtime/checkpoint/save.h"
#include "runtime/checkpoint/sha256.h"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/mpi_world.h"
#include "tests/test_support.h"

using namespace fsdp;
using testing::TinyTraining;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

checkpoint::TrainingProgress progress_at(int64_t step) {
  checkpoint::TrainingProgress p;
  p.step = step;
  return p;
}

// The metadata's own checksum made to match its (edited) text again: these damages stand
// for a metadata.json that is whole but disagrees with the files, which the deeper checks
// must catch.
void reseal(Json& j) {
  j.erase("metadata_sha256");
  j["metadata_sha256"] = checkpoint::sha256_hex(j.dump(1));
}

// Rewrites a shard file with `edit` applied to its tensors, and records the new size in
// metadata.json (so that the damage is found by the header checks, not the size check).
void rewrite_shard(const std::string& ckpt, const std::string& file,
                   const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
  Context ctx;
  const std::string path = ckpt + "/" + file;
  std::vector<std::pair<std::string, Tensor>> tensors;
  {
    checkpoint::SafetensorsReader r(path);
    for (const checkpoint::SafetensorsEntry& e : r.entries()) tensors.emplace_back(e.name, r.load(ctx, e.name));
  }
  edit(tensors);
  checkpoint::save_safetensors(ctx, path, tensors);
  const std::string meta = ckpt + "/metadata.json";
  Json j = Json::parse(checkpoint::read_text_file(meta));
  for (Json& f : j["files"])
    if (f["name"] == file) f["bytes"] = fs::file_size(path);
  reseal(j);
  checkpoint::write_file_atomically(meta, j.dump(1));
}

void edit_metadata(const std::string& ckpt, const std::function<void(Json&)>& edit,
                   bool keep_checksum_valid = true) {
  const std::string meta = ckpt + "/metadata.json";
  Json j = Json::parse(checkpoint::read_text_file(meta));
  edit(j);
  if (keep_checksum_valid) reseal(j);
  checkpoint::write_file_atomically(meta, j.dump(1));
}

struct Damage {
  const char* what;
  std::function<void(const std::string& ckpt)> apply;  // run by rank 0
  std::vector<std::string> expect;                      // in the error message
};

}  // namespace

TEST_CASE("a damaged checkpoint fails the load naming file and tensor; model and directory are unchanged",
          "[checkpoint][mpi]") {
  testing::MpiWorld w;
  const int n = w.size();
  const ShardingStrategy s = ShardingStrategy::OptimGradsParams;
  TinyTraining run(s, w.groups(s), w.rank(), n);
  run.train(0, 3);
  const std::string dir = testing::shared_scratch_dir("damage");
  checkpoint::save_checkpoint(run.ctx, &w.world.comm(), *run.sharded, run.optimizer.get(), run.groups,
                              progress_at(3), dir + "/pristine");
  run.train(3, 4);  // the model moves on: a partial load would show
  const std::vector<uint8_t> state = run.state_bytes();

  const std::string first = checkpoint::shard_file_name(0, n);
  const std::string last = checkpoint::shard_file_name(n - 1, n);
  const std::vector<Damage> damages = {
      {"truncated shard file",
       [&](const std::string& c) { fs::resize_file(c + "/" + last, fs::file_size(c + "/" + last) - 100); },
       {last, "truncated", "tensor \"exp_avg_sq/root\" is incomplete"}},
      {"bit flip in a tensor",
       [&](const std::string& c) { REQUIRE(testing::flip_byte(c + "/" + last, testing::middle_of(c + "/" + last, "exp_avg/h.1"))); },
       {last, "checksum mismatch in tensor \"exp_avg/h.1\""}},
      {"bit flip in a header", [&](const std::string& c) { REQUIRE(testing::flip_byte(c + "/" + first, 30)); }, {first}},
      {"missing shard file", [&](const std::string& c) { fs::remove(c + "/" + first); }, {first, "missing"}},
      {"tensor missing from a shard file",
       [&](const std::string& c) {
         rewrite_shard(c, first, [](auto& ts) {
           ts.erase(std::find_if(ts.begin(), ts.end(), [](auto& t) { return t.first == "exp_avg/h.0"; }));
         });
       },
       {first, "tensor \"exp_avg/h.0\" is missing"}},
      {"extra tensor in a shard file",
       [&](const std::string& c) {
         rewrite_shard(c, first, [](auto& ts) {
           Context ctx;
           ts.emplace_back("extra/h.0", ctx.empty_host(Shape{4}, DType::f32));
         });
       },
       {first, "holds tensor \"extra/h.0\""}},
      {"mis-shaped tensor in a shard file",
       [&](const std::string& c) {
         rewrite_shard(c, first, [](auto& ts) {
           for (auto& t : ts)
             if (t.first == "main/root") t.second = t.second.narrow(0, 0, t.second.numel() - 1);
         });
       },
       {first, "tensor \"main/root\" is F32 (", "metadata.json says F32 ("}},
      {"parameter missing from the checkpoint",
       [&](const std::string& c) { edit_metadata(c, [](Json& j) { j["parameters"].erase("wpe.weight"); }); },
       {"parameter \"wpe.weight\"", "is not in the checkpoint"}},
      // The metadata's own layout and its pieces disagree: refused before the model is
      // looked at.
      {"extra parameter in the pieces but not in the layout",
       [&](const std::string& c) {
         edit_metadata(c, [](Json& j) { j["parameters"]["h.7.extra.weight"] = j["parameters"]["wpe.weight"]; });
       },
       {"parameters.h.7.extra.weight", "of the layout does not place it"}},
      {"a parameter's shape differs from the layout's",
       [&](const std::string& c) {
         edit_metadata(c, [](Json& j) { j["parameters"]["wpe.weight"]["shape"] = Json::array({32, 16}); });
       },
       {"parameters.wpe.weight", "shape (32, 16) differs from the layout's (16, 32)"}},
      {"a piece's offset changed by one digit",
       [&](const std::string& c) {
         edit_metadata(c, [](Json& j) {
           Json& piece = j["parameters"]["wpe.weight"]["pieces"][0];
           piece[1] = piece[1].get<int64_t>() + 6;
         });
       },
       {"parameters.wpe.weight.pieces[0]", "disagrees with the layout"}},
      {"metadata.json edited, its checksum left as it was",
       [&](const std::string& c) { edit_metadata(c, [](Json& j) { j["step"] = 4; }, /*keep_checksum_valid=*/false); },
       {"metadata_sha256", "edited or damaged"}},
      {"pieces that do not cover a parameter",
       [&](const std::string& c) {
         edit_metadata(c, [](Json& j) { j["parameters"]["ln_f.bias"]["pieces"] = Json::array(); });
       },
       {"parameters.ln_f.bias", "the pieces cover 0 elements of 32"}},
      {"missing metadata.json", [&](const std::string& c) { fs::remove(c + "/metadata.json"); },
       {"no metadata.json"}},
      {"metadata.json that is not JSON",
       [&](const std::string& c) { checkpoint::write_file_atomically(c + "/metadata.json", "{\"format\": "); },
       {"metadata.json", "not valid JSON"}},
  };

  const std::string ckpt = dir + "/damaged";
  for (const Damage& d : damages) {
    INFO(d.what << " (" << n << " ranks)");
    std::map<std::string, std::string> before;
    if (w.rank() == 0) {
      fs::remove_all(ckpt);
      fs::copy(dir + "/pristine/step_000003", ckpt, fs::copy_options::recursive);
      d.apply(ckpt);
      before = testing::snapshot_directory(ckpt);
    }
    testing::barrier_all_ranks();
    std::string message;
    bool checkpoint_error = false;
    try {
      checkpoint::load_checkpoint(run.ctx, &w.world.comm(), *run.sharded, run.optimizer.get(), ckpt);
    } catch (const CheckpointError& e) {
      checkpoint_error = true;
      message = e.what();
    } catch (const std::exception& e) {
      message = e.what();
    }
    INFO("message: " << message);
    CHECK(checkpoint_error);
    for (const std::string& part : d.expect) CHECK_THAT(message, Contains(part));
    CHECK(run.state_bytes() == state);
    if (w.rank() == 0) CHECK(testing::snapshot_directory(ckpt) == before);
  }

  // The pristine copy loads, and brings the state back to step 3.
  checkpoint::load_checkpoint(run.ctx, &w.world.comm(), *run.sharded, run.optimizer.get(),
                              dir + "/pristine/step_000003");
  CHECK(run.state_bytes() != state);
  CHECK(run.optimizer->steps_taken() == 3);
}

TEST_CASE("a save that fails on one rank midway leaves latest at the previous checkpoint", "[checkpoint][mpi]") {
  testing::MpiWorld w;
  const int n = w.size();
  const ShardingStrategy s = ShardingStrategy::OptimGrads;
  const std::string dir = testing::shared_scratch_dir("failed_save");
  TinyTraining run(s, w.groups(s), w.rank(), n);
  run.train(0, 2);
  checkpoint::save_checkpoint(run.ctx, &w.world.comm(), *run.sharded, run.optimizer.get(), run.groups,
                              progress_at(2), dir);
  const std::vector<uint8_t> at_step_2 = run.state_bytes();
  run.train(2, 4);

  // Failures at each point of the save: in the middle of the last rank's shard file, after
  // the metadata, and after the rename but before `latest` moved (rank 0 commits).
  struct Failure {
    int rank;
    std::string point;
  };
  for (const Failure& f : {Failure{n - 1, "tensor_written:main/h.1"}, Failure{0, "metadata_written"},
                           Failure{0, "renamed"}}) {
    INFO("failure on rank " << f.rank << " at " << f.point);
    checkpoint::SaveOptions options;
    options.fault_hook = [&](const std::string& point) {
      if (w.rank() == f.rank && point == f.point) throw IoError("injected failure: no space left on device");
    };
    CHECK_THROWS_WITH(checkpoint::save_checkpoint(run.ctx, &w.world.comm(), *run.sharded, run.optimizer.get(),
                                                  run.groups, progress_at(4), dir, options),
                      Contains("injected failure"));
    CHECK(checkpoint::read_latest_marker(dir) == "step_000002");
    CHECK(checkpoint::find_checkpoint(dir) == dir + "/step_000002");

    // The previous checkpoint loads as it was saved.
    TinyTraining fresh(s, w.groups(s), w.rank(), n);
    checkpoint::load_checkpoint(fresh.ctx, &w.world.comm(), *fresh.sharded, fresh.optimizer.get(),
                                checkpoint::find_checkpoint(dir));
    CHECK(fresh.state_bytes() == at_step_2);
    testing::barrier_all_ranks();
  }

  // The next save succeeds and leaves no debris.
  const checkpoint::SaveResult r = checkpoint::save_checkpoint(run.ctx, &w.world.comm(), *run.sharded,
                                                               run.optimizer.get(), run.groups, progress_at(4), dir);
  CHECK(r.directory == dir + "/step_000004");
  CHECK(checkpoint::read_latest_marker(dir) == "step_000004");
  if (w.rank() == 0) {
    for (const fs::directory_entry& e : fs::directory_iterator(dir))
      CHECK(e.path().filename().string().rfind(".tmp", 0) == std::string::npos);
  }
  const std::vector<uint8_t> at_step_4 = run.state_bytes();
  TinyTraining fresh(s, w.groups(s), w.rank(), n);
  checkpoint::load_checkpoint(fresh.ctx, &w.world.comm(), *fresh.sharded, fresh.optimizer.get(),
                              checkpoint::find_checkpoint(dir));
  CHECK(fresh.state_bytes() == at_step_4);
}

TEST_CASE("most_recent_k keeps the newest checkpoints; saving a saved step again replaces it safely",
          "[checkpoint][mpi]") {
  testing::MpiWorld w;
  const int n = w.size();
  const ShardingStrategy s = ShardingStrategy::Optim;
  const std::string dir = testing::shared_scratch_dir("keep");
  TinyTraining run(s, w.groups(s), w.rank(), n);
  checkpoint::SaveOptions options;
  options.most_recent_k = 2;
  std::vector<uint8_t> at_step_3;
  for (int64_t step = 1; step <= 4; ++step) {
    run.train(step - 1, step);
    const checkpoint::SaveResult r = checkpoint::save_checkpoint(
        run.ctx, &w.world.comm(), *run.sharded, run.optimizer.get(), run.groups, progress_at(step), dir, options);
    CHECK(r.directory == dir + "/" + checkpoint::step_directory_name(step));
    CHECK(r.bytes > 0);
    if (step == 3) at_step_3 = run.state_bytes();
  }
  testing::barrier_all_ranks();
  CHECK_FALSE(fs::exists(dir + "/step_000001"));
  CHECK_FALSE(fs::exists(dir + "/step_000002"));
  CHECK(fs::exists(dir + "/step_000003/metadata.json"));
  CHECK(fs::exists(dir + "/step_000004/metadata.json"));

  // Step 4 again, with other state (a fresh run into an old save directory). Interrupted
  // between the renames, `latest` names step 3, which loads.
  run.train(4, 5);
  const std::vector<uint8_t> replaced = run.state_bytes();
  checkpoint::SaveOptions failing = options;
  failing.fault_hook = [&](const std::string& point) {
    if (point == "renamed") throw IoError("injected failure");
  };
  CHECK_THROWS_AS(checkpoint::save_checkpoint(run.ctx, &w.world.comm(), *run.sharded, run.optimizer.get(),
                                              run.groups, progress_at(4), dir, failing),
                  IoError);
  CHECK(checkpoint::read_latest_marker(dir) == "step_000003");
  {
    TinyTraining fresh(s, w.groups(s), w.rank(), n);
    checkpoint::load_checkpoint(fresh.ctx, &w.world.comm(), *fresh.sharded, fresh.optimizer.get(),
                                checkpoint::find_checkpoint(dir));
    CHECK(fresh.state_bytes() == at_step_3);
  }
  // Done properly, the new state is what step 4 holds, and nothing else is left behind.
  checkpoint::save_checkpoint(run.ctx, &w.world.comm(), *run.sharded, run.optimizer.get(), run.groups,
                              progress_at(4), dir, options);
  CHECK(checkpoint::read_latest_marker(dir) == "step_000004");
  TinyTraining fresh(s, w.groups(s), w.rank(), n);
  checkpoint::load_checkpoint(fresh.ctx, &w.world.comm(), *fresh.sharded, fresh.optimizer.get(), dir + "/step_000004");
  CHECK(fresh.state_bytes() == replaced);
  if (w.rank() == 0) {
    std::set<std::string> names;
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
    CHECK(names == std::set<std::string>{"latest", "step_000003", "step_000004"});
  }
}
