// Context parallelism against the whole sequence: the layout's index math on the host; on
// every rank of `mpirun -np 2 / -np 4` (cp = 2, the rest data-parallel), a tiny GPT-2 (learned
// positions) and Llama (rotary embeddings) in f64 with each rank holding chunks r and
// 2 cp - 1 - r of every sequence: the group's losses add up to the whole model's and the
// group's gradients to its gradient, within 1e-12 relative, for both ways of exchanging
// keys and values, with the collectives each issues counted (all-gather: one all-gather per
// attention forward and one reduce-scatter per backward; ring: a send and a receive per
// step); and the attention op on CUDA against the CPU through a group of one.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "collectives/mesh.h"
#include "collectives/world.h"
#include "kernels/ops.h"
#include "models/factory.h"
#include "runtime/autograd/graph.h"
#include "runtime/nn/context_parallel.h"
#include "runtime/nn/init.h"
#include "runtime/parallel/context_parallel.h"
#include "runtime/parallel/tensor_parallel.h"
#include "tests/mpi_world.h"
#include "tests/parallel/parallel_test_support.h"
#include "tests/test_support.h"

using namespace fsdp;

namespace {

TEST_CASE("a context-parallel layout holds chunks r and 2 cp - 1 - r", "[parallel]") {
  // 16 tokens over 4 ranks: 8 chunks of 2; rank 1 holds chunks 1 and 6.
  const auto l = nn::ContextParallelLayout::make(16, 4, 1);
  CHECK(l.chunk() == 2);
  CHECK(l.local_seq() == 4);
  CHECK(l.chunk_begin(0) == 2);
  CHECK(l.chunk_begin(1) == 12);
  CHECK(l.position(1, 0) == 2);
  CHECK(l.position(1, 3) == 13);
  CHECK(l.position(3, 2) == 8);  // rank 3's second chunk is chunk 4
  // Every position is held once over the ranks.
  std::vector<int> held(16, 0);
  for (int r = 0; r < 4; ++r)
    for (int64_t i = 0; i < l.local_seq(); ++i) held[size_t(l.position(r, i))]++;
  CHECK(held == std::vector<int>(16, 1));
  // Two sequences of 16 tokens: rank 1 keeps tokens 2-3 and 12-13 of each.
  std::vector<int32_t> rows(32);
  for (int i = 0; i < 32; ++i) rows[size_t(i)] = i;
  CHECK(split_sequences(rows, 2, l) == std::vector<int32_t>{2, 3, 12, 13, 18, 19, 28, 29});
  CHECK_THROWS_AS(nn::ContextParallelLayout::make(12, 4, 0), ShapeError);  // 12 % 8
  CHECK_THROWS_AS(nn::ContextParallelLayout::make(16, 4, 4), ShapeError);
  CHECK_THROWS_AS(split_sequences(rows, 3, l), ShapeError);
}

models::ModelConfig tiny(models::Family family) { return testing::tiny_parallel_model(family); }

using testing::values;

TEST_CASE("context-parallel attention equals the whole sequence's (f64)", "[parallel][mpi]") {
  testing::MpiWorld w;  // for the world only; the mesh below splits it
  const int cp = w.size() >= 2 ? 2 : 1;
  Mesh mesh({1, w.size() / cp, cp, 1, 1}, w.size());
  MeshCommunicators comms(w.world, mesh);
  Communicator& cp_comm = comms.axis(MeshAxis::cp);
  CommunicatorParallelGroup group(cp_comm);
  Context ctx;
  const int64_t B = 2, T = 8;
  const std::vector<int32_t> idx = testing::tiny_tokens(B * T, 7, 3), tgt = testing::tiny_tokens(B * T, 5, 1);
  const auto layout = nn::ContextParallelLayout::make(T, cp, cp_comm.rank());
  const int64_t Tl = layout.local_seq();
  for (models::Family family : {models::Family::GPT2, models::Family::Llama}) {
   for (const nn::ContextParallelComm comm : {nn::ContextParallelComm::all_gather, nn::ContextParallelComm::ring}) {
    const bool ring = comm == nn::ContextParallelComm::ring;
    for (const char* recompute : {"none", "full"}) {
      INFO(models::family_name(family) << ", recompute " << recompute << ", cp " << cp
                                       << (ring ? ", ring" : ", all-gather"));
      auto whole = models::build_model(tiny(family));
      auto split = models::build_model(tiny(family));
      const auto report = apply_context_parallel(*split, split->vocabulary_tables(),
                                                 split->layer_table(), group, T, comm);
      // Two attention layers, and GPT-2's learned positions.
      CHECK(report.size() == (cp > 1 ? (family == models::Family::GPT2 ? 3u : 2u) : 0u));
      for (auto* m : {whole.get(), split.get()}) {
        nn::materialize(ctx, *m, DType::f64, 1234);
        models::set_activation_recompute(*m, models::recompute_from_name(recompute));
      }
      auto run = [&](models::LanguageModel& m, const std::vector<int32_t>& x,
                     const std::vector<int32_t>& y, int64_t t) {
        autograd::Graph g(ctx);
        Tensor loss = m.forward(g, ops::from_host<int32_t>(ctx, x, Shape{B, t}),
                                ops::from_host<int32_t>(ctx, y, Shape{B, t}), B * t);
        g.backward(loss);
        return ops::item(ctx, loss);
      };
      const double want = run(*whole, idx, tgt, T);
      cp_comm.reset_counts();
      // This rank's tokens; its loss is their mean, so the group's mean of the ranks'
      // losses is the whole sequences' (each rank weighs its T / cp tokens as T).
      const double mine = run(*split, split_sequences(idx, B, layout), split_sequences(tgt, B, layout), Tl);
      const Communicator::Counts n = cp_comm.counts();
      const Tensor sum = ops::from_vector(ctx, {mine}, Shape{1}, DType::f64);
      cp_comm.all_reduce(sum, ReduceOp::Sum, ctx.stream());
      const double got = ops::item(ctx, sum) / cp;
      CHECK(std::abs(got - want) <= 1e-12 * std::abs(want));
      const bool full = std::string(recompute) == "full";
      if (cp == 1) {
        CHECK(n.all_gather + n.reduce_scatter + n.all_reduce + n.send + n.recv == 0);
      } else if (!ring) {
        CHECK(n.all_gather == (full ? 4u : 2u));  // one per layer's forward (two layers)
        CHECK(n.reduce_scatter == 2u);
        CHECK(n.all_reduce + n.send + n.recv == 0u);
      } else {
        // Per layer: cp - 1 steps forward (again under full recompute), and backward cp - 1
        // steps of keys and values and cp of their gradients; a send and a receive each.
        const size_t per_layer = size_t((full ? 2 : 1) * (cp - 1) + (2 * cp - 1));
        CHECK(n.send == 2 * per_layer);
        CHECK(n.recv == 2 * per_layer);
        CHECK(n.all_gather + n.reduce_scatter + n.all_reduce == 0u);
      }
      // The group's gradients, averaged as FSDP averages over dp x cp, are the whole model's.
      const std::vector<nn::Parameter*> wp = whole->named_parameters(), pp = split->named_parameters();
      REQUIRE(wp.size() == pp.size());
      for (size_t i = 0; i < wp.size(); ++i) {
        INFO(pp[i]->name());
        cp_comm.all_reduce(pp[i]->grad, ReduceOp::Sum, ctx.stream());
        const std::vector<double> g = values(ctx, pp[i]->grad), f = values(ctx, wp[i]->grad);
        double scale = 0;
        for (double v : f) scale = std::max(scale, std::abs(v));
        for (size_t k = 0; k < f.size(); ++k) CHECK(std::abs(g[k] / cp - f[k]) <= 1e-12 * scale);
      }
    }
   }
  }
}

// The op on CUDA (its chunks after earlier keys, and the ring's unmasked blocks and merges,
// run our own kernels) against the CPU: one rank holding chunks 0 and 1 of a 96-token
// sequence, GQA with rotary embeddings, both ways of exchanging keys and values (the ring
// also through a real NCCL group).
TEST_CASE("CUDA context-parallel attention matches the CPU's", "[parallel][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  testing::LocalGroup group;
  const int64_t B = 2, T = 96, H = 4, Hkv = 2, D = 32, width = (H + 2 * Hkv) * D;
  const auto layout = nn::ContextParallelLayout::make(T, 1, 0);
  std::vector<double> x(size_t(B * T * width)), dy(size_t(B * T * H * D));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37 * double(i));
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = std::cos(0.11 * double(i));
  struct Out {
    std::vector<double> y, dx;
  };
  // The ring also through an NCCL group of one (its steps on the group's own stream,
  // sending to itself), when this process is alone.
  WorldOptions options;
  options.backend = backend_from_name(testing::gpu_backend_name(), "FSDP_TEST_GPU_BACKEND");
  options.print_summary = false;
  World world(options);
  CommunicatorParallelGroup nccl_group(world.comm());
  struct Variant {
    nn::ContextParallelComm comm;
    nn::ParallelGroup* group;
    const char* what;
  };
  std::vector<Variant> variants = {{nn::ContextParallelComm::all_gather, &group, "all-gather"},
                                   {nn::ContextParallelComm::ring, &group, "ring"}};
  if (world.size() == 1) variants.push_back({nn::ContextParallelComm::ring, &nccl_group, "ring over NCCL"});
  for (const Variant& variant : variants) {
  INFO(variant.what);
  auto run = [&](Context& ctx, nn::ParallelGroup& grp) {
    autograd::Graph g(ctx);
    const Tensor qkv = autograd::Graph::leaf(ops::from_vector(ctx, x, Shape{B, T, width}, DType::f32));
    const Tensor y = nn::context_parallel_attention(g, qkv, H, Hkv, 10000.0, layout, grp, variant.comm);
    g.backward(y, ops::from_vector(ctx, dy, Shape{B, T, H * D}, DType::f32));
    return Out{values(ctx, y), values(ctx, autograd::Graph::grad(qkv))};
  };
  const Out want = run(cpu, group), got = run(gpu, *variant.group);
  REQUIRE(got.y.size() == want.y.size());
  REQUIRE(got.dx.size() == want.dx.size());
  // f32 on both sides, exp and sums in another order: 1e-4 of each tensor's scale.
  double ys = 0, ds = 0;
  for (double v : want.y) ys = std::max(ys, std::abs(v));
  for (double v : want.dx) ds = std::max(ds, std::abs(v));
  for (size_t i = 0; i < want.y.size(); ++i) CHECK(std::abs(got.y[i] - want.y[i]) <= 1e-4 * ys);
  for (size_t i = 0; i < want.dx.size(); ++i) CHECK(std::abs(got.dx[i] - want.dx[i]) <= 1e-4 * ds);
  }
}

}  // namespace
