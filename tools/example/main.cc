// fsdp_example: fsdp.cpp embedded as a library, with a training loop written by hand.
//
// This is the whole public C++ API a program needs to train a sharded model: a World (which
// process is which), a Mesh and its communicators, a Context (the device), a model built
// from a config, fully_shard() over the data-parallel groups, an Optimizer over the shards,
// and the step protocol of ShardedModel. The model trains, byte by byte, on a paragraph
// embedded below. Launch it as one process, or several with MPI (one per GPU on a GPU
// machine; several on the CPU):
//
//   fsdp_example --strategy optim_grads_params --steps 30
//   mpirun -np 2 fsdp_example --strategy optim --layers 2 --d-model 64
//
// Rank 0 prints one line per step: "step 3/30 loss 4.8123 grad_norm 1.234".
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collectives/mesh.h"
#include "collectives/world.h"
#include "kernels/ops.h"
#include "models/factory.h"
#include "runtime/autograd/graph.h"
#include "runtime/core/error.h"
#include "runtime/fsdp/sharded_model.h"
#include "runtime/optim/optimizer.h"
#include "runtime/parallel/data_parallel_groups.h"

namespace {

// The training text. Tokens are its bytes, so no tokenizer is needed.
const char kText[] =
    "It is a truth universally acknowledged, that a single man in possession of a good "
    "fortune, must be in want of a wife. However little known the feelings or views of such "
    "a man may be on his first entering a neighbourhood, this truth is so well fixed in the "
    "minds of the surrounding families, that he is considered the rightful property of some "
    "one or other of their daughters.";

struct Flags {
  fsdp::ShardingStrategy strategy = fsdp::ShardingStrategy::OptimGradsParams;  // ZeRO-3
  int steps = 30;
  int layers = 2;
  int d_model = 64;
  int heads = 4;
  int batch = 4;          // sequences per micro-batch per rank
  int seq = 32;           // tokens per sequence
  int micro_batches = 2;  // micro-batches per rank per optimizer step (gradient accumulation)
  double lr = 3e-3;
};

const char kUsage[] =
    "usage: fsdp_example [--strategy no_shard|optim|optim_grads|optim_grads_params]\n"
    "                    [--steps N] [--layers N] [--d-model N] [--heads N] [--batch N]\n"
    "                    [--seq N] [--micro-batches N] [--lr X]\n";

// Parses "--name value" pairs, before anything starts. Throws ConfigError for anything
// else; sets *help for --help.
Flags parse_flags(int argc, char** argv, bool* help) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    if (name == "--help" || name == "-h") {
      *help = true;
      continue;
    }
    FSDP_CHECK(i + 1 < argc, fsdp::ConfigError, "flag ", name, " needs a value");
    const std::string value = argv[++i];
    auto integer = [&] {
      char* end = nullptr;
      errno = 0;
      const long v = std::strtol(value.c_str(), &end, 10);
      FSDP_CHECK(!value.empty() && *end == '\0' && errno == 0 && v >= 1 && v <= INT_MAX,
                 fsdp::ConfigError, name, " must be an integer from 1 to ", INT_MAX, ", got '",
                 value, "'");
      return int(v);
    };
    auto positive_number = [&] {
      char* end = nullptr;
      const double v = std::strtod(value.c_str(), &end);
      FSDP_CHECK(!value.empty() && *end == '\0' && std::isfinite(v) && v > 0, fsdp::ConfigError,
                 name, " must be a positive number, got '", value, "'");
      return v;
    };
    if (name == "--strategy") f.strategy = fsdp::strategy_from_name(value);
    else if (name == "--steps") f.steps = integer();
    else if (name == "--layers") f.layers = integer();
    else if (name == "--d-model") f.d_model = integer();
    else if (name == "--heads") f.heads = integer();
    else if (name == "--batch") f.batch = integer();
    else if (name == "--seq") f.seq = integer();
    else if (name == "--micro-batches") f.micro_batches = integer();
    else if (name == "--lr") f.lr = positive_number();
    else FSDP_THROW(fsdp::ConfigError, "unknown flag ", name);
  }
  // A window is seq + 1 bytes of the text, starting anywhere in it.
  const int longest = int(sizeof(kText)) - 3;
  FSDP_CHECK(f.seq <= longest, fsdp::ConfigError, "--seq must be at most ", longest,
             " (the text has ", sizeof(kText) - 1, " bytes), got ", f.seq);
  return f;
}

// Fills one micro-batch: `batch` windows of the text, inputs and next-byte targets, for
// global sequence numbers `first` onwards. The numbers depend on the step, the micro-batch
// and the rank, so ranks read different windows; the global batch is batch x micro-batches
// x ranks sequences, so it grows with the number of ranks.
void fill_batch(int64_t first, int batch, int seq, std::vector<int32_t>& x, std::vector<int32_t>& y) {
  const int64_t len = int64_t(sizeof(kText)) - 1;
  for (int b = 0; b < batch; ++b) {
    const int64_t start = ((first + b) * 61) % (len - seq - 1);  // 61: a stride that wraps unevenly
    for (int t = 0; t < seq; ++t) {
      x[size_t(b * seq + t)] = int32_t(static_cast<unsigned char>(kText[start + t]));
      y[size_t(b * seq + t)] = int32_t(static_cast<unsigned char>(kText[start + t + 1]));
    }
  }
}

int run(const Flags& flags) {
  using namespace fsdp;

  // 1. The job: this process's rank, the backend (NCCL on a GPU, MPI otherwise) and its
  // device. One data-parallel axis here: every rank holds a shard of one model.
  World world;
  const int n = world.size();
  Mesh mesh({/*dp_outer=*/1, /*dp_shard=*/n, /*cp=*/1, /*ep=*/1, /*tp=*/1}, n);
  MeshCommunicators comms(world, mesh);
  Context ctx(world.device());

  // 2. The model, as specs: no parameter memory exists yet.
  models::ModelConfig config;
  config.family = models::Family::GPT2;
  config.n_layer = flags.layers;
  config.d_model = flags.d_model;
  config.n_head = flags.heads;
  config.vocab_size = 256;  // bytes
  config.seq_len = flags.seq;
  std::unique_ptr<models::LanguageModel> model = models::build_model(config);

  // 3. Sharding, applied from outside: each rank allocates and initializes only its shards.
  FsdpOptions options;
  options.strategy = flags.strategy;
  if (ctx.is_cuda()) options.compute_dtype = DType::bf16;  // gradients and master weights stay f32
  std::unique_ptr<ShardedModel> sharded =
      fully_shard(ctx, *model, data_parallel_groups(comms, options.strategy), options);

  // 4. The optimizer owns exactly this rank's shards.
  OptimizerConfig adam;
  adam.weight_decay = 0.1;
  Optimizer optimizer(ctx, sharded->optimizer_ranges(), adam);

  if (world.rank() == 0) {
    std::printf("model: %s, %lld parameters, %s over %d rank(s)\n%s\n", model->config().str().c_str(),
                static_cast<long long>(model->num_parameters()), strategy_name(options.strategy), n,
                sharded->memory_report().c_str());
  }

  // 5. The loop. Every rank runs the same calls in the same order.
  const int B = flags.batch, T = flags.seq, M = flags.micro_batches;
  std::vector<int32_t> x(size_t(B * T)), y(size_t(B * T));
  for (int step = 0; step < flags.steps; ++step) {
    world.set_step(step + 1);  // named in timeout messages
    sharded->start_step();
    double loss_sum = 0;
    for (int m = 0; m < M; ++m) {
      // The last micro-batch tells the schedule to reduce what has accumulated.
      sharded->start_micro_batch(m == M - 1);
      const int64_t micro_batch = (int64_t(step) * M + m) * n + world.rank();
      fill_batch(micro_batch * B, B, T, x, y);
      autograd::Graph graph(ctx);
      Tensor loss = model->forward(graph, ops::from_host<int32_t>(ctx, x, Shape{B, T}),
                                   ops::from_host<int32_t>(ctx, y, Shape{B, T}), int64_t(B) * T);
      loss_sum += ops::item(ctx, loss);
      graph.backward(loss);  // hooks gather weights ahead of use and reduce gradients
    }
    // Wait for the reductions, clip by the global norm, update the shards, publish them.
    sharded->finish_grad_sync();
    const double norm = sharded->grad_norm();
    FSDP_CHECK(std::isfinite(norm), Error, "step ", step + 1, ": gradient norm is ", norm);
    optimizer.step(flags.lr, sharded->grad_multiplier() * clip_coefficient(norm, 1.0));
    sharded->install_weights();

    // The step's loss: the mean over every rank's micro-batches.
    Tensor total = ops::from_host<double>(ctx, {loss_sum}, Shape{1});
    if (n > 1) world.comm().all_reduce(total, ReduceOp::Sum, ctx.stream());
    const double loss = ops::item(ctx, total) / double(M * n);
    if (world.rank() == 0) std::printf("step %d/%d loss %.4f grad_norm %.3f\n", step + 1, flags.steps, loss, norm);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    bool help = false;
    const Flags flags = parse_flags(argc, argv, &help);
    if (help) {
      std::printf("%s", kUsage);
      return 0;
    }
    return run(flags);
  } catch (const fsdp::ConfigError& e) {
    std::fprintf(stderr, "fsdp_example: %s\n%s", e.what(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp_example: error: %s\n", e.what());
    return 1;
  }
}
