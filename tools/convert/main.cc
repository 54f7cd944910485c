// convert: between native checkpoints and Hugging Face model directories.
//
//   convert export CHECKPOINT OUT_DIR [--dtype f32|bf16] [--no-check-batch]
//       CHECKPOINT: a step directory, or a save directory (its `latest`), saved with any
//       world size. Writes OUT_DIR/config.json, OUT_DIR/model.safetensors and (unless
//       --no-check-batch) OUT_DIR/fsdp_check_batch.safetensors for check_hf_export.py.
//   convert import HF_DIR SAVE_DIR [--padded-vocab N]
//       Writes the Hugging Face model as SAVE_DIR/step_000000 (weights only) and
//       SAVE_DIR/latest; `train --config ... checkpoint.load=SAVE_DIR` starts from it.
//   convert init OUT.safetensors --config RECIPE [key=value ...]
//       Writes the weights a run of the recipe starts from (fsdp.cpp names, one file), for
//       replaying the run elsewhere (tools/parity/curve.py).
//
// Exit codes: 0 success, 2 bad command line or unsupported model, 1 any other failure.
#include <cstdio>
#include <string>
#include <vector>

#include "models/config.h"
#include "runtime/core/error.h"
#include "tools/common/numeric_flags.h"
#include "tools/convert/hf_export.h"
#include "tools/convert/hf_import.h"
#include "tools/convert/initial_weights.h"

namespace {

const char* kUsage =
    "usage:\n"
    "  convert export CHECKPOINT OUT_DIR [--dtype f32|bf16] [--no-check-batch]\n"
    "  convert import HF_DIR SAVE_DIR [--padded-vocab N]\n"
    "  convert init OUT.safetensors --config RECIPE [key=value ...]\n";

struct UsageError : fsdp::ConfigError {
  using ConfigError::ConfigError;
};

int run(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::printf("%s", kUsage);
    return args.empty() ? 2 : 0;
  }
  const std::string& command = args[0];
  std::vector<std::string> positional;
  fsdp::convert::ExportOptions export_options;
  int64_t padded_vocab = 0;
  std::string recipe_path;
  std::vector<std::string> overrides;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw UsageError(a + " needs a value");
      return args[++i];
    };
    if (a == "--dtype") {
      const std::string d = value();
      if (d != "f32" && d != "bf16") throw UsageError("--dtype must be f32 or bf16, not " + d);
      export_options.dtype = d == "bf16" ? fsdp::DType::bf16 : fsdp::DType::f32;
    } else if (a == "--config") {
      recipe_path = value();
    } else if (command == "init" && a.find('=') != std::string::npos) {
      overrides.push_back(a);
    } else if (a == "--no-check-batch") {
      export_options.check_batch = false;
    } else if (a == "--padded-vocab") {
      // 0 = vocab_size rounded up to a multiple of 128; config.json's vocab_size is checked
      // against it once read.
      padded_vocab =
          fsdp::tools::integer_flag<int64_t>(a, value(), 0, fsdp::models::kMaxVocab + 127);
    } else if (a.rfind("--", 0) == 0) {
      throw UsageError("unknown option " + a);
    } else {
      positional.push_back(a);
    }
  }
  if (command == "init") {
    if (positional.size() != 1 || recipe_path.empty())
      throw UsageError("init takes one output file and --config RECIPE");
    const fsdp::train::Recipe recipe = fsdp::train::load_recipe(recipe_path, overrides);
    const fsdp::models::ModelConfig c = fsdp::convert::write_initial_weights(recipe, positional[0]);
    std::printf("wrote the initial weights of %s (seed %lld) to %s\n", c.str().c_str(),
                (long long)recipe.run.seed, positional[0].c_str());
    return 0;
  }
  if (positional.size() != 2) throw UsageError(command + " takes two directories");

  if (command == "export") {
    const fsdp::models::ModelConfig c = fsdp::convert::export_hf(positional[0], positional[1], export_options);
    std::printf("exported %s (%s) to %s\n", c.str().c_str(), fsdp::dtype_name(export_options.dtype),
                positional[1].c_str());
    return 0;
  }
  if (command == "import") {
    fsdp::Context ctx;
    const fsdp::convert::HfModel model = fsdp::convert::read_hf_model(ctx, positional[0], padded_vocab);
    const std::string dir = fsdp::convert::write_step0_checkpoint(ctx, model, positional[1]);
    std::printf("imported %s into %s\n", model.config.str().c_str(), dir.c_str());
    return 0;
  }
  throw UsageError("unknown command \"" + command + "\" (export, import or init)");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const UsageError& e) {
    std::fprintf(stderr, "convert: %s\n%s", e.what(), kUsage);
    return 2;
  } catch (const fsdp::ConfigError& e) {
    std::fprintf(stderr, "convert: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "convert: error: %s\n", e.what());
    return 1;
  }
}
