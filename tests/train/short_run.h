// What the tiny training tests share: the overrides of a short, silent run of a golden recipe
// (tests/train/golden/) on the byte tokens, and the options that keep the trainer quiet.
#pragma once

#include <string>
#include <vector>

#include "runtime/train/trainer.h"
#include "tests/test_support.h"  // from the test binary's main (catch_main or catch_main_mpi)
#include "tests/train/byte_tokens.h"
#include "tests/train/scratch_dir.h"

namespace fsdp::testing {

// `steps` steps on the byte tokens of a shard named `data`, the learning rate decaying over
// them, into a scratch directory named `tag` and this rank (so that ranks never share one),
// with no evaluation, no sample file and no update norms.
inline std::vector<std::string> short_run(const std::string& data, const std::string& tag,
                                          int steps) {
  return {"dataset.train_path=" + byte_tokens_shard(data),
          "run.output_dir=" + scratch_dir(tag + "_rank" + std::to_string(world_rank())),
          "logger.samples_file=null",
          "logger.log_update_norms=false",
          "train.train_iters=" + std::to_string(steps),
          "train.eval_interval=0",
          "scheduler.lr_decay_iters=" + std::to_string(steps)};
}

// a then b: a short run's overrides followed by a test's own (later keys win).
inline std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The trainer prints nothing and generates no sample; `alone` trains on this rank only (the
// single-process reference inside a multi-rank test).
inline train::TrainerOptions quiet_options(bool alone = false) {
  train::TrainerOptions options;
  options.out = nullptr;
  options.print_sample = false;
  options.alone = alone;
  return options;
}

}  // namespace fsdp::testing
