// One static collective schedule, counted: for every strategy, mesh shape and gradient
// accumulation, exactly how many all-gathers, reduce-scatters and all-reduces each
// data-parallel communicator carries per micro-batch and per optimizer step, when they are
// issued relative to compute (prefetch depth), and that every rank issued the same sequence
// (equal schedule hashes). Run plainly and under mpirun -np 2 / -np 4.
//
// The expected numbers are formulas over the schedule in runtime/fsdp/schedule.cc, with
// n blocks and U = n + 1 units (the blocks and the root):
//   ZeRO-3  per micro-batch: forward gathers the root and every block (n + 1); backward
//           gathers every block again except the last, kept from its forward (n - 1):
//           2n all-gathers; one reduce-scatter per unit.
//   ZeRO-2  per micro-batch: one reduce-scatter per unit.
//   ZeRO-1  per micro-batch: one reduce-scatter per unit on the last micro-batch only.
//   no_shard                 one all-reduce per unit on the last micro-batch only, over dp.
//   HSDP    (replicas > 1)   one all-reduce per unit over dp_outer on the last micro-batch.
//   per optimizer step: the gradient norm all-gathers every unit's block partial sums over
//           the shard group, packed (1); ZeRO-1/2 then all-gather each unit's updated
//           weights (U).
// A group of one rank runs no collective at all (local copies instead).
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collectives/mesh.h"
#include "collectives/world.h"
#include "kernels/ops.h"
#include "models/factory.h"
#include "runtime/autograd/graph.h"
#include "runtime/fsdp/sharded_model.h"
#include "tests/mpi_world.h"
#include "runtime/optim/optimizer.h"
#include "runtime/parallel/data_parallel_groups.h"
#include "tests/test_support.h"

using namespace fsdp;

namespace {

constexpr int kBlocks = 3;
constexpr int64_t kB = 2, kT = 8, kVocab = 64;
constexpr int kSteps = 2;

const ShardingStrategy kStrategies[] = {ShardingStrategy::NoShard, ShardingStrategy::Optim,
                                        ShardingStrategy::OptimGrads,
                                        ShardingStrategy::OptimGradsParams};

models::ModelConfig tiny_gpt2() {
  models::ModelConfig c;
  c.family = models::Family::GPT2;
  c.n_layer = kBlocks;
  c.d_model = 16;
  c.n_head = 2;
  c.vocab_size = kVocab;
  c.padded_vocab_size = kVocab;
  c.seq_len = kT;
  c.tie_embeddings = true;
  return c;
}

// All-gathers, reduce-scatters and all-reduces on one communicator.
struct Tally {
  uint64_t ag = 0, rs = 0, ar = 0;
};

// The data-parallel communicators of a mesh, by the names the schedule uses.
struct DpComms {
  Communicator* shard_ag;
  Communicator* shard_rs;
  Communicator* outer_ag;
  Communicator* outer_rs;
  Communicator* dp_ag;
  Communicator* dp_rs;
  std::vector<Communicator*> all() const { return {shard_ag, shard_rs, outer_ag, outer_rs, dp_ag, dp_rs}; }
};

DpComms dp_comms(MeshCommunicators& c) {
  return {&c.all_gather_comm(DpGroup::dp_shard), &c.reduce_scatter_comm(DpGroup::dp_shard),
          &c.all_gather_comm(DpGroup::dp_outer), &c.reduce_scatter_comm(DpGroup::dp_outer),
          &c.all_gather_comm(DpGroup::dp),       &c.reduce_scatter_comm(DpGroup::dp)};
}

void reset(const DpComms& comms) {
  for (Communicator* c : comms.all()) c->reset_counts();
}

// What each communicator should have carried in one phase; communicators not named carry
// nothing.
struct Expected {
  Tally shard_ag, shard_rs, outer_rs, dp_rs;
  Tally of(const DpComms& comms, const Communicator* c) const {
    if (c == comms.shard_ag) return shard_ag;
    if (c == comms.shard_rs) return shard_rs;
    if (c == comms.outer_rs) return outer_rs;
    if (c == comms.dp_rs) return dp_rs;
    return Tally();
  }
};

// Compares every data-parallel communicator's counts since its last reset with `want`.
void check_counts(const DpComms& comms, const Expected& want, const std::string& phase) {
  for (Communicator* c : comms.all()) {
    const Communicator::Counts& got = c->counts();
    const Tally w = want.of(comms, c);
    INFO(phase << ", communicator " << c->name() << " (rank " << c->rank() << " of " << c->size() << ")");
    CHECK(got.all_gather == w.ag);
    CHECK(got.reduce_scatter == w.rs);
    CHECK(got.all_reduce == w.ar);
    CHECK(got.broadcast + got.send + got.recv + got.barrier == 0);
  }
}

uint64_t sum_over(const DpComms& comms, uint64_t Communicator::Counts::*field) {
  uint64_t n = 0;
  for (Communicator* c : comms.all()) n += c->counts().*field;
  return n;
}

// The schedule of `strategy` on a mesh with `shard` x `outer` data-parallel ranks.
struct Schedule {
  ShardingStrategy strategy;
  int shard = 1, outer = 1;
  int n = kBlocks, units = kBlocks + 1;

  bool zero3() const { return strategy == ShardingStrategy::OptimGradsParams; }
  bool grads_sharded() const { return zero3() || strategy == ShardingStrategy::OptimGrads; }
  bool sharding() const { return strategy != ShardingStrategy::NoShard && shard > 1; }

  Expected micro_batch(bool last) const {
    Expected e;
    if (strategy == ShardingStrategy::NoShard) {
      // DDP over every data-parallel rank: one all-reduce per unit, last micro-batch only.
      if (last && shard * outer > 1) e.dp_rs.ar = uint64_t(units);
      return e;
    }
    if (sharding()) {
      // ZeRO-3: root + n blocks in forward, n - 1 blocks in backward (the last stays).
      if (zero3()) e.shard_ag.ag = uint64_t((n + 1) + (n - 1));
      // ZeRO-2/3 reduce-scatter every micro-batch, ZeRO-1 only the accumulated last.
      if (grads_sharded() || last) e.shard_rs.rs = uint64_t(units);
    }
    // HSDP: the reduced shards are averaged over the replicas once per step.
    if (last && outer > 1) e.outer_rs.ar = uint64_t(units);
    return e;
  }

  Expected optimizer_step() const {
    Expected e;
    if (!sharding()) return e;  // the norm of a whole (or unsharded) gradient is local
    e.shard_ag.ag = 1;                                    // block partial sums of the norm
    if (!zero3()) e.shard_ag.ag += uint64_t(units);       // ZeRO-1/2: install updated weights
    return e;
  }
};

// A tiny GPT-2 under fully_shard with its optimizer, trained step by step by the tests.
struct Run {
  Context ctx;
  std::unique_ptr<models::LanguageModel> model;
  std::unique_ptr<ShardedModel> sharded;
  std::unique_ptr<Optimizer> optimizer;

  Run(const DataParallelGroups& groups, ShardingStrategy strategy, int prefetch) {
    model = models::build_model(tiny_gpt2());
    FsdpOptions fo;
    fo.strategy = strategy;
    fo.prefetch_units = prefetch;
    fo.shard_block = 128;
    sharded = fully_shard(ctx, *model, groups, fo);
    optimizer = std::make_unique<Optimizer>(ctx, sharded->optimizer_ranges(), OptimizerConfig());
  }

  // Forward and backward of one micro-batch (start_micro_batch already called).
  void forward_backward(int64_t sample) {
    std::vector<int32_t> idx(kB * kT), tgt(kB * kT);
    for (int64_t i = 0; i < kB * kT; ++i) {
      idx[size_t(i)] = int32_t((sample * 7 + i * 3) % kVocab);
      tgt[size_t(i)] = int32_t((sample * 7 + i * 3 + 3) % kVocab);
    }
    autograd::Graph g(ctx);
    Tensor loss = model->forward(g, ops::from_host<int32_t>(ctx, idx, Shape{kB, kT}),
                                 ops::from_host<int32_t>(ctx, tgt, Shape{kB, kT}), kB * kT);
    g.backward(loss);
  }

  // Everything between the last backward and the next step's first forward.
  void optimizer_step() {
    sharded->finish_grad_sync();
    const double norm = sharded->grad_norm();
    optimizer->step(1e-3, sharded->grad_multiplier() * clip_coefficient(norm, 1.0));
    sharded->install_weights();
  }
};

// Every rank's schedule hash of every data-parallel communicator is the same.
void check_hashes_agree(const DpComms& comms) {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  for (Communicator* c : comms.all()) {
    const uint64_t mine = c->schedule_hash();
    std::vector<uint64_t> all(size_t(n), 0);
    MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
    for (int r = 0; r < n; ++r) {
      INFO("communicator " << c->name() << ": rank " << r << " issued a different sequence");
      CHECK(all[size_t(r)] == mine);
    }
  }
}

// Trains kSteps steps of `accumulation` micro-batches, checking the counts of every phase,
// and the sharded model's own tally of the step against the communicators'.
void train_and_count(MeshCommunicators& mc, const Schedule& s, int accumulation, int prefetch) {
  const DpComms comms = dp_comms(mc);
  Run run(data_parallel_groups(mc, s.strategy), s.strategy, prefetch);
  REQUIRE(run.sharded->num_units() == s.units);
  for (int step = 0; step < kSteps; ++step) {
    reset(comms);
    run.sharded->start_step();
    uint64_t ag = 0, rs = 0, ar = 0;  // this step's totals over the communicators
    for (int m = 0; m < accumulation; ++m) {
      const bool last = m == accumulation - 1;
      run.sharded->start_micro_batch(last);
      run.forward_backward(step * accumulation + m);
      check_counts(comms, s.micro_batch(last),
                   "step " + std::to_string(step) + " micro-batch " + std::to_string(m));
      ag += sum_over(comms, &Communicator::Counts::all_gather);
      rs += sum_over(comms, &Communicator::Counts::reduce_scatter);
      ar += sum_over(comms, &Communicator::Counts::all_reduce);
      reset(comms);
    }
    run.optimizer_step();
    check_counts(comms, s.optimizer_step(), "optimizer step " + std::to_string(step));
    // issued() counts every collective the sharded model issued since start_step(): the
    // norm's gather and the ZeRO-1/2 installs included.
    const Expected step_end = s.optimizer_step();
    CHECK(uint64_t(run.sharded->issued().all_gathers) == ag + step_end.shard_ag.ag);
    CHECK(uint64_t(run.sharded->issued().reduce_scatters) == rs);
    CHECK(uint64_t(run.sharded->issued().all_reduces) == ar);
  }
  check_hashes_agree(comms);
}

// Every (replicas, shards) factorization of the world.
std::vector<std::pair<int, int>> mesh_shapes(int world) {
  std::vector<std::pair<int, int>> shapes;
  for (int outer = 1; outer <= world; ++outer)
    if (world % outer == 0) shapes.push_back({outer, world / outer});
  return shapes;
}

}  // namespace

TEST_CASE("each strategy issues exactly its collectives per micro-batch and per step",
          "[fsdp][mpi]") {
  World world(testing::quiet_mpi_world());
  for (auto [outer, shard] : mesh_shapes(world.size())) {
    Mesh mesh({outer, shard, 1, 1, 1}, world.size());
    MeshCommunicators mc(world, mesh);
    for (ShardingStrategy strategy : kStrategies) {
      for (int accumulation : {1, 3}) {
        INFO(strategy_name(strategy) << ", mesh dp_outer=" << outer << " x dp_shard=" << shard
                                     << ", accumulation " << accumulation);
        Schedule s{strategy, shard, outer};
        train_and_count(mc, s, accumulation, /*prefetch=*/1);
      }
    }
  }
}

TEST_CASE("the expected counts, written out for 3 blocks", "[fsdp][mpi]") {
  // Pins the formula to numbers, so that a wrong formula and a wrong schedule cannot agree
  // by accident: 3 blocks, 4 units.
  Schedule s{ShardingStrategy::OptimGradsParams, 2, 1};
  CHECK(s.micro_batch(false).shard_ag.ag == 6);
  CHECK(s.micro_batch(false).shard_rs.rs == 4);
  CHECK(s.micro_batch(true).outer_rs.ar == 0);
  CHECK(s.optimizer_step().shard_ag.ag == 1);
  Schedule z1{ShardingStrategy::Optim, 2, 2};
  CHECK(z1.micro_batch(false).shard_rs.rs == 0);
  CHECK(z1.micro_batch(true).shard_rs.rs == 4);
  CHECK(z1.micro_batch(true).outer_rs.ar == 4);
  CHECK(z1.optimizer_step().shard_ag.ag == 5);
  Schedule ddp{ShardingStrategy::NoShard, 2, 2};
  CHECK(ddp.micro_batch(true).dp_rs.ar == 4);
  CHECK(ddp.optimizer_step().shard_ag.ag == 0);
}

TEST_CASE("prefetch depth changes when gathers are issued, not which or how many",
          "[fsdp][mpi]") {
  World world(testing::quiet_mpi_world());
  const int n = world.size();
  Mesh mesh({1, n, 1, 1, 1}, n);
  const int accumulation = 3;
  std::vector<std::vector<uint64_t>> hashes;  // per prefetch depth, per communicator
  for (int prefetch : {0, 1, 2}) {
    INFO("prefetch_units " << prefetch << ", world " << n);
    // Fresh communicators, so that their schedule hashes cover this run alone.
    MeshCommunicators mc(world, mesh);
    const DpComms comms = dp_comms(mc);
    const Schedule s{ShardingStrategy::OptimGradsParams, n, 1};
    train_and_count(mc, s, accumulation, prefetch);

    // When: the all-gathers issued so far this micro-batch, seen from the blocks' own hooks
    // (registered after fully_shard's, so they run after them). Forward, at block i: the
    // root and blocks 0..i+prefetch. Backward, at block i: additionally blocks
    // max(0, i - prefetch)..n-2 (the last block was kept from forward). Reduce-scatters are
    // issued as soon as a block's backward is done: n - i of them after block i's.
    Run run(data_parallel_groups(mc, s.strategy), s.strategy, prefetch);
    std::vector<nn::Module*> blocks = run.model->blocks();
    REQUIRE(int(blocks.size()) == kBlocks);
    // "<where>: <count>" lines, so that a mismatch prints readably.
    std::vector<std::string> seen_ag, want_ag, seen_rs, want_rs;
    auto at = [](const std::string& where, uint64_t count) { return where + ": " + std::to_string(count); };
    for (int i = 0; i < kBlocks; ++i) {
      const std::string b = std::to_string(i);
      blocks[size_t(i)]->add_hook(nn::HookPoint::PreForward, [&, at, b](nn::Module&, autograd::Graph&) {
        seen_ag.push_back(at("forward " + b, comms.shard_ag->counts().all_gather));
      });
      blocks[size_t(i)]->add_hook(nn::HookPoint::PreBackward, [&, at, b](nn::Module&, autograd::Graph&) {
        seen_ag.push_back(at("backward " + b, comms.shard_ag->counts().all_gather));
      });
      blocks[size_t(i)]->add_hook(nn::HookPoint::PostBackward, [&, at, b](nn::Module&, autograd::Graph&) {
        seen_rs.push_back(at("after backward " + b, comms.shard_rs->counts().reduce_scatter));
      });
    }
    const bool sharded = n > 1;
    for (int i = 0; i < kBlocks; ++i) {
      const int gathered = std::min(i + prefetch, kBlocks - 1) + 1;
      want_ag.push_back(at("forward " + std::to_string(i), sharded ? uint64_t(1 + gathered) : 0));
    }
    for (int i = kBlocks - 1; i >= 0; --i) {
      const int again = std::max(0, (kBlocks - 1) - std::max(0, i - prefetch));
      want_ag.push_back(at("backward " + std::to_string(i), sharded ? uint64_t(1 + kBlocks + again) : 0));
      want_rs.push_back(at("after backward " + std::to_string(i), sharded ? uint64_t(kBlocks - i) : 0));
    }
    run.sharded->start_step();
    for (int m = 0; m < accumulation; ++m) {
      reset(comms);
      seen_ag.clear();
      seen_rs.clear();
      run.sharded->start_micro_batch(m == accumulation - 1);
      run.forward_backward(m);
      INFO("micro-batch " << m);
      CHECK(seen_ag == want_ag);
      CHECK(seen_rs == want_rs);
    }
    run.optimizer_step();

    hashes.emplace_back();
    for (Communicator* c : comms.all()) hashes.back().push_back(c->schedule_hash());
  }
  // Which collectives, in which order and of which sizes: the same at every depth.
  for (size_t p = 1; p < hashes.size(); ++p) {
    INFO("prefetch_units " << p << " vs 0");
    CHECK(hashes[p] == hashes[0]);
  }
}
