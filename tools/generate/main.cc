// generate: samples text from a trained model.
//
//   generate MODEL [--prompt TEXT] [--max-new-tokens N] [--temperature T] [--top-k K]
//            [--top-p P] [--seed S] [--device auto|cpu|cuda] [--dtype f32|bf16]
//            [--no-kv-cache] [--print-ids] [--vocab FILE --merges FILE]
//
// MODEL is a native checkpoint (a step directory, or a save directory: its latest) saved
// with any world size and strategy, or a Hugging Face directory written by `convert export`.
// Prints the prompt and its continuation; the prompt is read once into a key/value cache,
// then each new token costs one token's forward. Exit status: 0 success, 2 bad arguments,
// 1 any other failure.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "models/generate.h"
#include "runtime/core/device.h"
#include "runtime/core/error.h"
#include "runtime/data/assets.h"
#include "runtime/data/tokenizer.h"
#include "tools/common/numeric_flags.h"
#include "tools/generate/load_model.h"

namespace {

using fsdp::ConfigError;
using fsdp::tools::integer_flag;
using fsdp::tools::number_flag;

constexpr const char* kUsage = R"(usage: generate MODEL [options]

Samples a continuation of a prompt from MODEL: a native checkpoint (a step directory, or a
save directory: its latest), saved with any world size and strategy, or a Hugging Face
directory written by `convert export`.

options:
  --prompt TEXT          text to continue (default "It is a truth universally acknowledged")
  --max-new-tokens N     tokens to generate, at most 1048576 (default 64)
  --temperature T        softmax temperature, finite, >= 0; 0 = greedy (default 1.0)
  --top-k K              sample among the K most likely tokens, at most the model's
                         vocabulary; 0 = all (default 0)
  --top-p P              then among the fewest most likely whose probability reaches P,
                         in (0, 1] (default 1.0: all)
  --seed S               seed of the sampler, from 0 to 2^64 - 1 (default 1)
  --device auto|cpu|cuda where to run; auto = the first GPU if there is one (default auto)
  --dtype f32|bf16       weights and activations (default f32; bf16 on CUDA only)
  --no-kv-cache          run the whole context for every token (slower; for comparisons)
  --print-ids            also print the token ids: lines "prompt ids: ..." and "ids: ..."
  --vocab FILE, --merges FILE   the GPT-2 tokenizer's files (default: the shipped ones)
  -h, --help             show this help
)";

struct Options {
  std::string model;
  std::string prompt = "It is a truth universally acknowledged";
  fsdp::models::SampleOptions sample;
  std::string device = "auto";
  std::string dtype = "f32";
  bool print_ids = false;
  std::string vocab, merges;
};

std::string from_user(const std::string& path) {
  const char* dir = std::getenv("BUILD_WORKING_DIRECTORY");  // under `bazel run`
  if (dir == nullptr || path.empty() || path.front() == '/') return path;
  return std::string(dir) + "/" + path;
}

// The most tokens one call generates (past the model's context the cache restarts from its
// last half: models/generate.h).
constexpr int64_t kMaxNewTokens = int64_t(1) << 20;

// Returns false for --help.
bool parse(int argc, char** argv, Options& o) {
  o.sample.n_tokens = 64;
  o.sample.kv_cache = true;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") return false;
    if (arg == "--no-kv-cache") {
      o.sample.kv_cache = false;
      continue;
    }
    if (arg == "--print-ids") {
      o.print_ids = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      FSDP_CHECK(o.model.empty(), ConfigError, "one MODEL only, got '", o.model, "' and '", arg,
                 "'");
      o.model = from_user(arg);
      continue;
    }
    std::string value;
    if (const auto eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else {
      FSDP_CHECK(i + 1 < argc, ConfigError, arg, " needs a value (see --help)");
      value = argv[++i];
    }
    if (arg == "--prompt") {
      o.prompt = value;
    } else if (arg == "--max-new-tokens") {
      o.sample.n_tokens = integer_flag<int64_t>(arg, value, 0, kMaxNewTokens);
    } else if (arg == "--temperature") {
      o.sample.temperature = number_flag(arg, value, 0);
    } else if (arg == "--top-k") {
      // Bounded by the model's vocabulary once it is loaded.
      o.sample.top_k = integer_flag<int64_t>(arg, value, 0, std::numeric_limits<int32_t>::max());
    } else if (arg == "--top-p") {
      o.sample.top_p = number_flag(arg, value, 0, 1);
      FSDP_CHECK(o.sample.top_p > 0, ConfigError, "--top-p must be in (0, 1], got '", value, "'");
    } else if (arg == "--seed") {
      o.sample.seed = integer_flag<uint64_t>(arg, value, 0, std::numeric_limits<uint64_t>::max());
    } else if (arg == "--device") {
      FSDP_CHECK(value == "auto" || value == "cpu" || value == "cuda", ConfigError,
                 "--device must be auto, cpu or cuda, got ", value);
      o.device = value;
    } else if (arg == "--dtype") {
      FSDP_CHECK(value == "f32" || value == "bf16", ConfigError,
                 "--dtype must be f32 or bf16, got ", value);
      o.dtype = value;
    } else if (arg == "--vocab") {
      o.vocab = from_user(value);
    } else if (arg == "--merges") {
      o.merges = from_user(value);
    } else {
      FSDP_THROW(ConfigError, "unknown option '", arg, "' (see --help)");
    }
  }
  FSDP_CHECK(!o.model.empty(), ConfigError, "no MODEL given (see --help)");
  return true;
}

int run(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const bool gpu = o.device == "cuda" || (o.device == "auto" && fsdp::cuda_device_count() > 0);
  FSDP_CHECK(!gpu || fsdp::cuda_device_count() > 0, ConfigError,
             "--device cuda: no GPU (or a CPU-only build)");
  FSDP_CHECK(gpu || o.dtype == "f32", ConfigError, "--dtype bf16 needs --device cuda");
  fsdp::Context ctx(gpu ? fsdp::Device::cuda(0) : fsdp::Device::cpu());

  const std::string argv0 = argc > 0 ? argv[0] : "";
  fsdp::data::Gpt2Tokenizer tokenizer(
      fsdp::data::locate_asset(o.vocab.empty() ? fsdp::data::kGpt2VocabAsset : o.vocab, argv0),
      fsdp::data::locate_asset(o.merges.empty() ? fsdp::data::kGpt2MergesAsset : o.merges, argv0));
  auto model = fsdp::generate::load_model(
      ctx, o.model, o.dtype == "bf16" ? fsdp::DType::bf16 : fsdp::DType::f32);
  FSDP_CHECK(tokenizer.vocab_size() <= model->config().vocab_size, ConfigError, "the tokenizer's ",
             tokenizer.vocab_size(), " tokens do not fit the model's vocabulary of ",
             model->config().vocab_size);
  FSDP_CHECK(o.sample.top_k <= model->config().vocab_size, ConfigError, "--top-k ", o.sample.top_k,
             " is more than the model's vocabulary of ", model->config().vocab_size,
             " tokens (0 = all)");
  const std::vector<int32_t> prompt = tokenizer.encode(o.prompt);
  FSDP_CHECK(!prompt.empty(), ConfigError, "--prompt is empty");

  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = fsdp::models::generate(ctx, *model, prompt, o.sample);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s%s\n", o.prompt.c_str(), tokenizer.decode(ids).c_str());
  if (o.print_ids) {
    std::printf("prompt ids:");
    for (int32_t id : prompt) std::printf(" %d", id);
    std::printf("\nids:");
    for (int32_t id : ids) std::printf(" %d", id);
    std::printf("\n");
  }
  std::fprintf(stderr, "generate: %s, %zu prompt tokens, %zu new in %.2f s (%.1f tokens/s, %s%s)\n",
               model->config().str().c_str(), prompt.size(), ids.size(), seconds,
               seconds > 0 ? double(ids.size()) / seconds : 0.0, gpu ? "cuda" : "cpu",
               o.sample.kv_cache ? ", kv cache" : "");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const fsdp::ConfigError& e) {
    std::fprintf(stderr, "generate: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "generate: %s\n", e.what());
    return 1;
  }
}
