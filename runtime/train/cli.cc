#include "runtime/train/cli.h"

#include "runtime/core/error.h"
#include "runtime/train/recipe.h"

namespace fsdp::train {

CommandLine parse_command_line(const std::vector<std::string>& args) {
  CommandLine cl;
  auto add_override = [&](const std::string& kv) {
    const size_t eq = kv.find('=');
    FSDP_CHECK(eq != std::string::npos && eq > 0, ConfigError, "override '", kv,
               "' is not of the form section.key=VALUE");
    cl.overrides.push_back(kv);
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const char* flag) -> std::string {
      FSDP_CHECK(i + 1 < args.size(), ConfigError, flag, " needs a value");
      return args[++i];
    };
    if (a == "--config" || a == "-c") {
      cl.config = value("--config");
    } else if (a.rfind("--config=", 0) == 0) {
      cl.config = a.substr(9);
    } else if (a == "--set") {
      add_override(value("--set"));
    } else if (a.rfind("--set=", 0) == 0) {
      add_override(a.substr(6));
    } else if (a == "--dry-run") {
      cl.dry_run = true;
    } else if (a == "--no-resume") {
      cl.no_resume = true;
    } else if (a == "--help" || a == "-h") {
      cl.help = true;
    } else if (a == "--version") {
      cl.version = true;
    } else if (a.rfind("-", 0) == 0) {
      FSDP_THROW(ConfigError, "unknown option '", a, "' (see --help)");
    } else {
      add_override(a);
    }
  }
  FSDP_CHECK(cl.help || cl.version || !cl.config.empty(), ConfigError,
             "no recipe given: train --config FILE [KEY=VALUE ...] (see --help)");
  return cl;
}

std::string usage_text() {
  return "usage: train --config FILE [KEY=VALUE ...] [--set KEY=VALUE] [--dry-run] [--no-resume]\n"
         "       train --help | --version\n"
         "\n"
         "Trains the model a JSON recipe describes. Launch one process per GPU (or several on\n"
         "the CPU) with mpirun, srun, or torchrun-style variables (RANK, WORLD_SIZE, ...).\n"
         "\n"
         "  --config FILE     the recipe (see configs/)\n"
         "  KEY=VALUE         override a recipe key, e.g. optimizer.lr=3e-4 (same as --set)\n"
         "  --dry-run         print the resolved recipe, parameter count, tokens per step and the\n"
         "                    per-GPU memory estimate, then exit without touching a GPU\n"
         "  --no-resume       start fresh even if checkpoint.load names a checkpoint\n"
         "  --version         the git revision and the CUDA, cuDNN, cuBLAS, NCCL, MPI versions\n"
         "\n"
         "Exit codes: 0 success (also after a requested stop: SIGTERM / SIGUSR1 save a checkpoint\n"
         "and exit 0), 2 configuration error, 1 runtime failure.\n"
         "\n"
         "Recipe keys:\n" +
         recipe_help_text();
}

}  // namespace fsdp::train
