// A program that uses fsdp.cpp as an installed library (scripts/install.sh), built with
// CMake or make, never Bazel: a 2-layer GPT-2 trained with ZeRO-3 on the bytes of a
// sentence. Run it as one process or under `mpirun -np 2`; rank 0 prints one line per step,
// "step 3/20 loss 4.8123", the same lines for any number of ranks.
#include <cstdio>
#include <memory>
#include <vector>

#include "collectives/mesh.h"
#include "collectives/world.h"
#include "kernels/ops.h"
#include "models/factory.h"
#include "runtime/autograd/graph.h"
#include "runtime/fsdp/sharded_model.h"
#include "runtime/optim/optimizer.h"
#include "runtime/parallel/data_parallel_groups.h"

namespace {

const char kText[] = "It is a truth universally acknowledged, that a single man in possession "
                     "of a good fortune, must be in want of a wife.";
constexpr int kSteps = 20, kBatch = 8, kSeq = 16;  // kBatch sequences per step, in all

// Sequence `s` of the text: inputs and next-byte targets.
void fill_sequence(int64_t s, int32_t* x, int32_t* y) {
  const int64_t start = (s * 7) % (int64_t(sizeof(kText)) - 1 - kSeq - 1);
  for (int t = 0; t < kSeq; ++t) {
    x[t] = static_cast<unsigned char>(kText[start + t]);
    y[t] = static_cast<unsigned char>(kText[start + t + 1]);
  }
}

}  // namespace

int main() {
  using namespace fsdp;
  try {
    World world;  // rank and size from the launcher (mpirun), MPI on the CPU, NCCL on GPUs
    const int ranks = world.size();
    Mesh mesh({/*dp_outer=*/1, /*dp_shard=*/ranks, /*cp=*/1, /*ep=*/1, /*tp=*/1}, ranks);
    MeshCommunicators comms(world, mesh);
    Context ctx(world.device());

    models::ModelConfig config;  // GPT-2 family by default
    config.n_layer = 2;
    config.d_model = 32;
    config.n_head = 2;
    config.vocab_size = 256;  // bytes
    config.seq_len = kSeq;
    std::unique_ptr<models::LanguageModel> model = models::build_model(config);

    FsdpOptions options;
    options.strategy = ShardingStrategy::OptimGradsParams;  // ZeRO-3
    std::unique_ptr<ShardedModel> sharded =
        fully_shard(ctx, *model, data_parallel_groups(comms, options.strategy), options);
    Optimizer optimizer(ctx, sharded->optimizer_ranges(), OptimizerConfig{});

    const int local = kBatch / ranks;  // this rank's sequences of each step
    std::vector<int32_t> x(size_t(local * kSeq)), y(size_t(local * kSeq));
    for (int step = 1; step <= kSteps; ++step) {
      sharded->start_step();
      sharded->start_micro_batch(/*last=*/true);
      for (int b = 0; b < local; ++b)
        fill_sequence(int64_t(step) * kBatch + world.rank() * local + b, &x[size_t(b * kSeq)],
                      &y[size_t(b * kSeq)]);
      autograd::Graph graph(ctx);
      Tensor loss = model->forward(graph, ops::from_host<int32_t>(ctx, x, Shape{local, kSeq}),
                                   ops::from_host<int32_t>(ctx, y, Shape{local, kSeq}));
      const double local_loss = ops::item(ctx, loss);
      graph.backward(loss);
      sharded->finish_grad_sync();
      optimizer.step(1e-2, sharded->grad_multiplier() * clip_coefficient(sharded->grad_norm(), 1.0));
      sharded->install_weights();

      Tensor total = ops::from_host<double>(ctx, {local_loss}, Shape{1});
      if (ranks > 1) world.comm().all_reduce(total, ReduceOp::Sum, ctx.stream());
      if (world.rank() == 0)
        std::printf("step %d/%d loss %.6f\n", step, kSteps, ops::item(ctx, total) / ranks);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
