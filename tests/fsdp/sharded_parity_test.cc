// Sharding never changes the math: every strategy x data-parallel size x gradient
// accumulation gives, on the CPU, per-step losses bitwise equal to a single process's
// no_shard run over the same global batches. Run plainly and under mpirun -np 2 / -np 4.
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>

#include "collectives/mesh.h"
#include "collectives/world.h"
#include "kernels/ops.h"
#include "models/factory.h"
#include "runtime/autograd/graph.h"
#include "runtime/fsdp/memory.h"
#include "runtime/fsdp/sharded_model.h"
#include "runtime/optim/optimizer.h"
#include "runtime/parallel/muon_matrices.h"
#include "runtime/parallel/data_parallel_groups.h"
#include "tests/kernels/nn_test_util.h"
#include "tests/mpi_world.h"
#include "tests/test_support.h"

using namespace fsdp;

namespace {

constexpr int64_t kB = 2, kT = 16, kVocab = 96;

models::ModelConfig small_gpt(bool llama) {
  models::ModelConfig c = llama ? models::llama_small_config() : models::ModelConfig();
  if (!llama) c.family = models::Family::GPT2;
  c.n_layer = 3;
  c.d_model = 32;
  c.n_head = 4;
  c.n_kv_head = llama ? 2 : 0;
  c.d_ff = 0;
  c.vocab_size = kVocab;
  c.padded_vocab_size = 128;
  c.seq_len = kT;
  c.tie_embeddings = !llama;
  return c;
}

// Tokens of global sample s: a fixed pseudo-random function of (s, position).
void sample_tokens(int64_t s, int32_t* idx, int32_t* tgt) {
  uint64_t h = 0x9e3779b97f4a7c15ull * uint64_t(s + 1);
  std::vector<int32_t> seq(kT + 1);
  for (int64_t t = 0; t <= kT; ++t) {
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    // Mostly a repeating pattern (learnable), sometimes noise.
    seq[size_t(t)] = (h % 5 == 0) ? int32_t(h % kVocab) : int32_t((s * 7 + t * 3) % kVocab);
  }
  for (int64_t t = 0; t < kT; ++t) {
    idx[t] = seq[size_t(t)];
    tgt[t] = seq[size_t(t) + 1];
  }
}

struct RunOptions {
  ShardingStrategy strategy = ShardingStrategy::NoShard;
  int accumulation = 1;  // micro-batches per rank per step
  bool llama = false;
  bool recompute = false;
  int steps = 6;
  // The head and loss: chunked (nn::classifier_loss) with this many rows per chunk, or the
  // unchunked logits path (linear + cross_entropy) when logits_path.
  int64_t chunk_rows = models::kDefaultClassifierChunkRows;
  bool logits_path = false;
  bool nccl_ub = false;  // registrable buffers, sums then 1/dp (registration: MPI no-op)
  int blocks_per_unit = 1;
};

// Trains with `groups` (null groups: a single process) and returns the per-step mean losses.
// Global micro-batch k of a step holds samples [k*B, (k+1)*B); rank r of `dp` takes
// k = m*dp + r for its micro-step m.
std::vector<double> train(const RunOptions& o, const DataParallelGroups& groups, int dp_rank,
                          int dp) {
  Context ctx;
  models::ModelConfig mc = small_gpt(o.llama);
  mc.classifier_chunk_rows = o.chunk_rows;
  auto model = models::build_model(mc);
  if (o.recompute) models::set_activation_recompute(*model, models::Recompute::full);
  FsdpOptions fo;
  fo.strategy = o.strategy;
  fo.compute_dtype = DType::f32;
  fo.main_dtype = DType::f32;
  fo.grad_dtype = DType::f32;
  fo.reduce_dtype = DType::f64;  // exact accumulation and reduction
  fo.shard_block = 128;
  fo.seed = 42;
  fo.nccl_ub = o.nccl_ub;
  fo.blocks_per_unit = o.blocks_per_unit;
  auto sharded = fully_shard(ctx, *model, groups, fo);
  OptimizerConfig oc;
  oc.weight_decay = 0.1;
  Optimizer opt(ctx, sharded->optimizer_ranges(), oc);

  std::vector<double> losses;
  Communicator* loss_comm = groups.replicate ? groups.replicate : groups.shard_reduce;
  for (int step = 0; step < o.steps; ++step) {
    sharded->start_step();
    double loss_sum = 0;
    for (int m = 0; m < o.accumulation; ++m) {
      sharded->start_micro_batch(m == o.accumulation - 1);
      const int64_t k = int64_t(step) * o.accumulation * dp + int64_t(m) * dp + dp_rank;
      std::vector<int32_t> idx(kB * kT), tgt(kB * kT);
      // A small data set seen again and again, so that the loss falls within a few steps.
      for (int64_t b = 0; b < kB; ++b) sample_tokens((k * kB + b) % 8, &idx[b * kT], &tgt[b * kT]);
      autograd::Graph g(ctx);
      Tensor x = ops::from_host<int32_t>(ctx, idx, Shape{kB, kT});
      Tensor y = ops::from_host<int32_t>(ctx, tgt, Shape{kB, kT});
      Tensor logits;
      Tensor loss = model->forward(g, x, y, kB * kT, o.logits_path ? &logits : nullptr);
      loss_sum += ops::item(ctx, loss);
      g.backward(loss);
    }
    sharded->finish_grad_sync();
    const double norm = sharded->grad_norm();
    opt.step(0.02, sharded->grad_multiplier() * clip_coefficient(norm, 0.5));
    sharded->install_weights();
    // The step's loss: the mean over every rank's micro-batches (exact sum of f32 values in
    // f64, so independent of the order).
    if (loss_comm && dp > 1) {
      Tensor l = ops::from_host<double>(ctx, {loss_sum}, Shape{1});
      // Sum over all data-parallel ranks: shard group, then replicas (HSDP).
      if (groups.shard_reduce) groups.shard_reduce->all_reduce(l, ReduceOp::Sum, ctx.stream()).synchronize();
      if (groups.replicate) groups.replicate->all_reduce(l, ReduceOp::Sum, ctx.stream()).synchronize();
      loss_sum = ops::item(ctx, l);
    }
    losses.push_back(loss_sum / double(o.accumulation * dp));
  }
  return losses;
}

std::vector<double> reference(RunOptions o, int dp) {
  o.strategy = ShardingStrategy::NoShard;
  o.accumulation *= dp;
  return train(o, DataParallelGroups(), 0, 1);
}

void check_bitwise(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("step " << i << ": " << got[i] << " vs " << want[i]);
    CHECK(std::memcmp(&got[i], &want[i], sizeof(double)) == 0);
  }
}

}  // namespace

TEST_CASE("every strategy matches the single-process run bitwise", "[fsdp][mpi]") {
  testing::MpiWorld w;
  const int n = w.size();
  for (ShardingStrategy s : {ShardingStrategy::NoShard, ShardingStrategy::Optim,
                             ShardingStrategy::OptimGrads, ShardingStrategy::OptimGradsParams}) {
    for (int acc : {1, 4}) {
      INFO("strategy " << strategy_name(s) << ", accumulation " << acc << ", world " << n);
      RunOptions o;
      o.strategy = s;
      o.accumulation = acc;
      const std::vector<double> want = reference(o, n);
      // The loss must actually move, or equality would prove little.
      CHECK(want.back() < want.front());
      check_bitwise(train(o, w.groups(s), w.rank(), n), want);
    }
  }
}

TEST_CASE("with nccl_ub every sharded strategy matches the single-process run bitwise",
          "[fsdp][mpi]") {
  // On the CPU the registrations are MPI no-ops, but the buffers, the persistent
  // reduce-scatter staging (f32 gradients cast into an f64 input) and the sum-then-1/dp
  // reduction are those of a GPU run.
  testing::MpiWorld w;
  const int n = w.size();
  for (ShardingStrategy s : {ShardingStrategy::Optim, ShardingStrategy::OptimGrads,
                             ShardingStrategy::OptimGradsParams}) {
    INFO("strategy " << strategy_name(s) << ", world " << n);
    RunOptions o;
    o.strategy = s;
    o.accumulation = 2;
    o.nccl_ub = true;
    const std::vector<double> want = reference(o, n);
    CHECK(want.back() < want.front());
    check_bitwise(train(o, w.groups(s), w.rank(), n), want);
  }
}

TEST_CASE("ZeRO-3 with a Llama model and activation recompute matches bitwise", "[fsdp][mpi]") {
  testing::MpiWorld w;
  const int n = w.size();
  RunOptions o;
  o.strategy = ShardingStrategy::OptimGradsParams;
  o.accumulation = 2;
  o.llama = true;
  o.recompute = true;
  check_bitwise(train(o, w.groups(o.strategy), w.rank(), n), reference(o, n));
}

TEST_CASE("units of several blocks match the single-process run bitwise, and one-block units",
          "[fsdp][mpi]") {
  // Three blocks: two per unit makes units of 2 and 1 blocks; three per unit one unit. The
  // hooks gather before a unit's first block, reduce after its first block's backward, and
  // every block's recomputed forward waits for the gather.
  testing::MpiWorld w;
  const int n = w.size();
  for (int per_unit : {2, 3}) {
    for (ShardingStrategy s : {ShardingStrategy::Optim, ShardingStrategy::OptimGrads,
                               ShardingStrategy::OptimGradsParams}) {
      for (bool recompute : {false, true}) {
        INFO(per_unit << " blocks per unit, strategy " << strategy_name(s) << ", recompute "
                      << recompute << ", world " << n);
        RunOptions o;
        o.strategy = s;
        o.accumulation = 2;
        o.llama = recompute;
        o.recompute = recompute;
        o.blocks_per_unit = per_unit;
        const std::vector<double> want = reference(o, n);
        CHECK(want.back() < want.front());
        check_bitwise(train(o, w.groups(s), w.rank(), n), want);
        // Against one block per unit: the same training, up to the order in which the
        // gradient norm's partial sums are added (the shards' padding moves with the units),
        // which changes the clipping factor in its last bits.
        RunOptions one = o;
        one.blocks_per_unit = 1;
        const std::vector<double> single = reference(one, n);
        for (size_t i = 0; i < want.size(); ++i) CHECK(want[i] == Approx(single[i]).epsilon(1e-6));
      }
    }
  }
}

// The head's weight gradient (tied to wte in GPT-2, lm_head in Llama) reaches the root unit's
// reduction under every strategy: training with the chunked classifier (5 rows per chunk:
// 32 tokens per micro-batch do not divide) follows the single-process logits path. Not
// bitwise (the gradients are summed in another order), but a lost or doubled head gradient
// moves the losses by far more than the tolerance.
TEST_CASE("the chunked classifier trains like the logits path under every strategy",
          "[fsdp][mpi]") {
  testing::MpiWorld w;
  const int n = w.size();
  for (bool llama : {false, true}) {
    RunOptions ref;
    ref.llama = llama;
    ref.accumulation = 2;
    ref.logits_path = true;
    const std::vector<double> want = reference(ref, n);
    for (ShardingStrategy s : {ShardingStrategy::NoShard, ShardingStrategy::Optim,
                               ShardingStrategy::OptimGrads, ShardingStrategy::OptimGradsParams}) {
      INFO((llama ? "llama" : "gpt2") << ", strategy " << strategy_name(s) << ", world " << n);
      RunOptions o = ref;
      o.strategy = s;
      o.logits_path = false;
      o.chunk_rows = 5;
      const std::vector<double> got = train(o, w.groups(s), w.rank(), n);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        INFO("step " << i);
        CHECK(got[i] == Approx(want[i]).epsilon(1e-4));
      }
    }
  }
}

TEST_CASE("HSDP (replicas x shards) matches bitwise", "[fsdp][mpi]") {
  World world(testing::quiet_mpi_world());
  const int n = world.size();
  if (n != 4) {
    fsdp::testing::mark_skipped("HSDP 2x2 needs 4 ranks");
    return;
  }
  Mesh mesh({2, 2, 1, 1, 1}, n);
  MeshCommunicators comms(world, mesh);
  const int dp_rank = world.rank();  // dp group = every rank, row-major (outer, shard)
  for (ShardingStrategy s : {ShardingStrategy::Optim, ShardingStrategy::OptimGradsParams}) {
    INFO("strategy " << strategy_name(s));
    RunOptions o;
    o.strategy = s;
    o.accumulation = 2;
    check_bitwise(train(o, data_parallel_groups(comms, s), dp_rank, n), reference(o, n));
  }
}

TEST_CASE("the memory estimate equals what a sharded model allocates", "[fsdp][mpi]") {
  testing::MpiWorld w;
  const int n = w.size();
  for (ShardingStrategy s : {ShardingStrategy::NoShard, ShardingStrategy::Optim,
                             ShardingStrategy::OptimGrads, ShardingStrategy::OptimGradsParams}) {
    for (auto [reduce, ub] : {std::pair{DType::f32, false}, std::pair{DType::f64, false},
                              std::pair{DType::f32, true}, std::pair{DType::f64, true}}) {
      INFO(strategy_name(s) << " reduce " << dtype_name(reduce) << (ub ? " nccl_ub" : ""));
      Context ctx;
      auto model = models::build_model(small_gpt(false));
      FsdpOptions fo;
      fo.strategy = s;
      fo.reduce_dtype = reduce;
      fo.shard_block = 128;
      fo.nccl_ub = ub;
      const DataParallelGroups groups = w.groups(s);
      const size_t before = ctx.allocator()->stats().in_use;
      auto sharded = fully_shard(ctx, *model, groups, fo);
      const MemoryBreakdown est = estimate_memory(sharded->plan(), fo);
      CHECK(est.total() == sharded->memory().total());
      CHECK(est.compute_weights == sharded->memory().compute_weights);
      CHECK(est.grad_pool == sharded->memory().grad_pool);
      CHECK(est.gather_pool == sharded->memory().gather_pool);
      // Everything the model holds after set-up is accounted for.
      CHECK(ctx.allocator()->stats().in_use - before == est.total());
      // ZeRO-3 persistent bytes per parameter per rank: (2 + 4 + 4) / N for f32 compute
      // weights... here compute is f32: 4 + 4 + reduce bytes, over N, plus padding. (Not
      // with nccl_ub: a tiny model's registrable buffers are mostly 2 MiB granules.)
      if (s == ShardingStrategy::OptimGradsParams && !ub) {
        const double per_param = double(est.compute_weights + est.main_weights + est.grad_accumulation) /
                                 double(sharded->plan().total_numel());
        const double expected = double(4 + 4 + dtype_size(reduce)) / n;
        CHECK(per_param >= expected);
        CHECK(per_param <= expected * 1.5);  // block padding of a tiny model
      }
    }
  }
}

TEST_CASE("the optimizer state estimate equals what the optimizer allocates", "[fsdp][mpi]") {
  testing::MpiWorld w;
  Context ctx;
  auto model = models::build_model(small_gpt(false));
  FsdpOptions fo;
  fo.shard_block = 128;
  auto sharded = fully_shard(ctx, *model, w.groups(fo.strategy), fo);
  for (DType moments : {DType::f32, DType::bf16}) {
    OptimizerConfig oc;
    oc.moments_dtype = moments;
    const size_t before = ctx.allocator()->stats().in_use;
    Optimizer opt(ctx, sharded->optimizer_ranges(), oc);
    const size_t est = optimizer_state_bytes(sharded->plan(), OptimizerKind::adamw, moments, w.rank());
    CHECK(opt.state_bytes() == est);
    CHECK(ctx.allocator()->stats().in_use - before == est);
  }
  // Muon: one momentum for every element, a second moment only for AdamW's, and the exchange
  // buffers.
  const MuonMatrices matrices(*model, model->layer_table(), nullptr);
  for (DType moments : {DType::f32, DType::bf16}) {
    OptimizerConfig oc;
    oc.kind = OptimizerKind::muon;
    oc.moments_dtype = moments;
    const size_t before = ctx.allocator()->stats().in_use;
    Optimizer opt(ctx, sharded->optimizer_ranges(), oc,
                  muon_orthogonalizer(ctx, *sharded, matrices.specs(), oc));
    const size_t est = optimizer_state_bytes(sharded->plan(), OptimizerKind::muon, moments, w.rank(),
                                             muon_param_names(*model, model->layer_table()));
    CHECK(opt.state_bytes() == est);
    CHECK(ctx.allocator()->stats().in_use - before == est);
    // A step through the exchange (the sanitizers' run of it): with a gradient everywhere,
    // every piece of a matrix this rank holds moves, whichever rank orthogonalized it, and
    // every weight stays finite.
    std::vector<std::vector<double>> old_weights;
    for (const OptimizerRange& r : opt.ranges()) {
      ops::fill(ctx, r.grad, 1e-2);
      old_weights.push_back(testing::values(ctx, r.main));
    }
    const IssuedCollectives before_step = sharded->issued();
    opt.step(1e-3, 1.0);
    // The exchange goes through the step's counted path: one all-gather and one
    // reduce-scatter per sharded unit with matrices.
    const IssuedCollectives& issued = sharded->issued();
    if (sharded->shard_size() > 1) {
      CHECK(issued.all_gathers > before_step.all_gathers);
      CHECK(issued.all_gathers - before_step.all_gathers ==
            issued.reduce_scatters - before_step.reduce_scatters);
      CHECK(issued.all_gather_bytes - before_step.all_gather_bytes ==
            issued.reduce_scatter_bytes - before_step.reduce_scatter_bytes);
    }
    for (size_t i = 0; i < opt.ranges().size(); ++i) {
      const OptimizerRange& r = opt.ranges()[i];
      const std::vector<double> after = testing::values(ctx, r.main);
      INFO(r.name);
      size_t unmoved = 0;
      for (size_t k = 0; k < after.size(); ++k) {
        REQUIRE(std::isfinite(after[k]));
        unmoved += after[k] == old_weights[i][k];
      }
      // Element by element: a piece the reduce-scatter missed would keep its old values.
      if (r.matrix) CHECK(unmoved == 0);
    }
  }
}
