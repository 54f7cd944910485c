// train: the training binary, a thin main() over fsdp::train::Trainer.
//
// Exit codes: 0 success (including a stop requested by SIGTERM or SIGUSR1, after the
// checkpoint is saved), 2 configuration error, 1 runtime failure.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "collectives/bootstrap.h"
#include "runtime/core/device.h"
#include "runtime/core/error.h"
#include "runtime/train/cli.h"
#include "runtime/train/dry_run.h"
#include "runtime/train/recipe.h"
#include "runtime/train/trainer.h"
#include "runtime/train/version.h"
#include "tools/common/exit_after_failure.h"
#include "tools/train/build_info.h"

namespace {

// Set by the signal handler, read between micro-batches and steps. A signal handler can
// only reach a variable with static storage; this one lives in the binary, not in the
// library.
volatile std::sig_atomic_t g_stop_signal = 0;

// The first SIGTERM / SIGUSR1 asks for a checkpoint and a clean stop; a second one ends the
// process at once (its default action), for a stop that takes too long.
void on_stop_signal(int sig) {
  if (g_stop_signal != 0) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_stop_signal = sig;
}

// This process's rank from the launcher's environment (before any World exists), so that
// configuration errors print once rather than once per rank.
int launcher_rank() {
  try {
    return fsdp::parse_launch_env(fsdp::process_environment()).rank;
  } catch (const fsdp::Error&) {
    // An inconsistent launch environment (the error is reported later): the first rank
    // variable that reads as a number still names this process.
    for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"}) {
      const char* v = std::getenv(var);
      char* end = nullptr;
      const long r = v ? std::strtol(v, &end, 10) : -1;
      if (v && *v && end && *end == '\0' && r >= 0 && r < (1L << 30)) return int(r);
    }
    return 0;
  }
}

// Open MPI's mpirun does not forward a SIGTERM or Ctrl-C it receives at once: it sends the
// ranks SIGTERM odls_base_sigkill_timeout seconds later and SIGKILL as long after that (1 s
// by default: too soon to write the stop checkpoint). The setting reaches the ranks as
// OMPI_MCA_odls_base_sigkill_timeout; when a run that saves checkpoints was launched without
// enough of it, rank 0 says how to launch, and which signal stops the job at once.
constexpr int kStopGraceSeconds = 30;

void warn_if_mpirun_kills_too_soon(const fsdp::train::Recipe& recipe, int rank) {
  if (rank != 0 || !recipe.checkpoint.save || !std::getenv("OMPI_COMM_WORLD_SIZE")) return;
  const char* grace = std::getenv("OMPI_MCA_odls_base_sigkill_timeout");
  char* end = nullptr;
  const long seconds = grace && *grace ? std::strtol(grace, &end, 10) : 1;
  if (grace && *grace && (!end || *end != '\0')) return;  // not ours to judge
  if (seconds >= kStopGraceSeconds) return;
  std::fprintf(stderr,
               "warning: a SIGTERM or Ctrl-C to mpirun reaches the ranks with %ld s left "
               "before mpirun kills them, too little to save the stop checkpoint: launch "
               "with `mpirun --mca odls_base_sigkill_timeout 120 ...`, or stop the job with "
               "SIGUSR1 to mpirun (forwarded at once) or SIGTERM to the ranks (as Slurm "
               "does)\n",
               seconds);
}

}  // namespace

int main(int argc, char** argv) {
  // `bazel run` starts us in the runfiles tree; recipes name paths from where the user is.
  if (const char* wd = std::getenv("BUILD_WORKING_DIRECTORY")) {
    if (chdir(wd) != 0) std::fprintf(stderr, "warning: cannot enter %s\n", wd);
  }
  const int rank = launcher_rank();
  // The trainer lives outside the try block: on failure the message is printed before any of
  // its destructors run (after a failed collective they could wait on a peer that is gone),
  // and the process ends at once with the status.
  std::unique_ptr<fsdp::train::Trainer> trainer;
  fsdp::train::CommandLine cl;
  try {
    cl = fsdp::train::parse_command_line(std::vector<std::string>(argv + 1, argv + argc));
    if (cl.help) {
      if (rank == 0) std::printf("%s", fsdp::train::usage_text().c_str());
      return 0;
    }
    if (cl.version) {
      if (rank == 0) std::printf("%s", fsdp::train::version_report(FSDP_GIT_REVISION).c_str());
      return 0;
    }
    fsdp::train::Recipe recipe = fsdp::train::load_recipe(cl.config, cl.overrides);
    if (cl.dry_run) {
      const fsdp::LaunchInfo launch = fsdp::parse_launch_env(fsdp::process_environment());
      const bool cuda = recipe.dist.device == "cuda" || (recipe.dist.device == "auto" && fsdp::cuda_built());
      // The staged backend puts the node's ranks on its GPUs round-robin (one GPU assumed
      // where none is visible).
      const int gpus = std::max(fsdp::cuda_device_count(), 1);
      const int per_device = cuda && recipe.dist.backend == "staged"
                                 ? (launch.local_size + gpus - 1) / gpus : 1;
      if (rank == 0) {
        std::printf("%s", fsdp::train::dry_run_report(recipe, launch.size, cuda, per_device).c_str());
      }
      return 0;
    }
    warn_if_mpirun_kills_too_soon(recipe, rank);
    std::signal(SIGTERM, on_stop_signal);
    std::signal(SIGUSR1, on_stop_signal);
    // A write past the file-size limit (ulimit -f) then fails with EFBIG, which the save
    // reports naming the file and leaves the previous checkpoint as latest, instead of the
    // signal ending the rank without a word.
    std::signal(SIGXFSZ, SIG_IGN);
    fsdp::train::TrainerOptions options;
    options.resume = !cl.no_resume;
    options.stop_requested = [] { return g_stop_signal != 0; };
    options.on_comm_failure = fsdp::tools::exit_after_failure();
    trainer = std::make_unique<fsdp::train::Trainer>(recipe, options);
    trainer->run();
    return 0;
  } catch (const fsdp::ConfigError& e) {
    // Every rank says why it stops (the same message on each), so no rank's log is silent.
    std::fprintf(stderr, "[rank %d] configuration error: %s\n", rank, e.what());
    std::fflush(nullptr);
    std::_Exit(2);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] error: %s\n", rank, e.what());
    std::fflush(nullptr);
    std::_Exit(1);
  }
}
