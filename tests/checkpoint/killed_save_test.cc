// A process killed (SIGKILL) in the middle of writing its shard file leaves `latest` naming
// the previous complete checkpoint, which loads as it was saved; the next save succeeds and
// clears what the killed one left. The save runs in a forked child, which kills itself from
// the saver's fault hook after part of the file is written.
#include <csignal>
#include <filesystem>

#include <sys/wait.h>
#include <unistd.h>

#include "runtime/checkpoint/checkpoint_reader.h"
#include "runtime/checkpoint/load.h"
#include "runtime/checkpoint/save.h"
#include "tests/checkpoint/checkpoint_test_util.h"
#include "tests/test_support.h"

using namespace fsdp;
using testing::TinyTraining;
namespace fs = std::filesystem;

namespace {

checkpoint::TrainingProgress progress_at(int64_t step) {
  checkpoint::TrainingProgress p;
  p.step = step;
  return p;
}

}  // namespace

TEST_CASE("a process killed while writing a checkpoint leaves the previous one as latest", "[checkpoint]") {
  const std::string dir = testing::shared_scratch_dir("killed");
  TinyTraining run(ShardingStrategy::NoShard, DataParallelGroups(), 0, 1);
  run.train(0, 2);
  checkpoint::save_checkpoint(run.ctx, nullptr, *run.sharded, run.optimizer.get(), run.groups,
                              progress_at(2), dir);
  const std::vector<uint8_t> at_step_2 = run.state_bytes();
  run.train(2, 3);

  for (const std::string point : {"tensor_written:main/h.1", "metadata_written", "renamed"}) {
    INFO("killed at " << point);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      checkpoint::SaveOptions options;
      options.fault_hook = [&](const std::string& p) {
        if (p == point) std::raise(SIGKILL);
      };
      try {
        checkpoint::save_checkpoint(run.ctx, nullptr, *run.sharded, run.optimizer.get(), run.groups,
                                    progress_at(3), dir, options);
      } catch (...) {
      }
      _exit(0);  // not reached when the hook fired
    }
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    REQUIRE(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGKILL);

    CHECK(checkpoint::read_latest_marker(dir) == "step_000002");
    if (point.rfind("tensor_written", 0) == 0) {
      // Killed mid-file: part of it is on disk, in the temporary directory only.
      const std::string partial = dir + "/.tmp_step_000003/shard_00000_of_00001.safetensors.tmp";
      REQUIRE(fs::exists(partial));
      CHECK(fs::file_size(partial) > 0);
      CHECK_FALSE(fs::exists(dir + "/step_000003"));
    }
    TinyTraining fresh(ShardingStrategy::NoShard, DataParallelGroups(), 0, 1);
    checkpoint::load_checkpoint(fresh.ctx, nullptr, *fresh.sharded, fresh.optimizer.get(),
                                checkpoint::find_checkpoint(dir));
    CHECK(fresh.state_bytes() == at_step_2);
    CHECK(fresh.optimizer->steps_taken() == 2);
  }

  const checkpoint::SaveResult r = checkpoint::save_checkpoint(run.ctx, nullptr, *run.sharded, run.optimizer.get(),
                                                               run.groups, progress_at(3), dir);
  CHECK(checkpoint::read_latest_marker(dir) == "step_000003");
  CHECK_FALSE(fs::exists(dir + "/.tmp_step_000003"));
  TinyTraining fresh(ShardingStrategy::NoShard, DataParallelGroups(), 0, 1);
  checkpoint::load_checkpoint(fresh.ctx, nullptr, *fresh.sharded, fresh.optimizer.get(), r.directory);
  CHECK(fresh.state_bytes() == run.state_bytes());
}
