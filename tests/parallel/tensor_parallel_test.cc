// Tensor parallelism against the unsplit model: a ParallelSlice's index math; and, on every
// rank of `mpirun -np 2 / -np 4` (tp = 2, the rest data-parallel), a tiny GPT-2 and Llama in
// f64 split by apply_tensor_parallel: each local parameter initializes to its slice of the
// whole model's initialization, bit for bit; the loss equals the whole model's and every
// local gradient its slice of the whole model's gradient, within 1e-12 relative; and each
// forward plus backward issues exactly 4 all-reduces per block on the tensor-parallel
// communicator (attention and MLP outputs forward, their inputs' gradients backward).
// Activation recompute re-runs the forward sums inside backward: 6 per block. With sequence
// parallelism the same holds (the partial gradients of the norms and row-parallel biases
// summed over the group), with all-gathers and reduce-scatters in place of the all-reduces.
// The vocabulary is split too: the embedding's rows summed over the group, the head's loss
// merged from the ranks' softmax statistics chunk by chunk, its input's gradient summed.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "collectives/mesh.h"
#include "collectives/world.h"
#include "kernels/ops.h"
#include "models/factory.h"
#include "runtime/autograd/graph.h"
#include "runtime/nn/functional.h"
#include "runtime/nn/init.h"
#include "runtime/nn/parallel_slice.h"
#include "runtime/parallel/tensor_parallel.h"
#include "tests/mpi_world.h"
#include "tests/parallel/parallel_test_support.h"
#include "tests/test_support.h"

using namespace fsdp;

namespace {

TEST_CASE("a parallel slice maps its local elements to the full tensor's", "[parallel]") {
  // A fused (12, 5) weight; this rank holds rows [0, 2), [4, 6) and [8, 10) (three parts).
  nn::ParallelSlice rows{Shape{12, 5}, 0, {{0, 2}, {4, 6}, {8, 10}}};
  rows.check();
  CHECK(rows.local_shape() == Shape{6, 5});
  std::vector<int64_t> full;
  for (const auto& r : rows.runs(0, 30))
    for (int64_t i = 0; i < r.numel; ++i) full.push_back(r.full + i);
  REQUIRE(full.size() == 30);
  for (int64_t l = 0; l < 30; ++l) {
    const int64_t local_row = l / 5, col = l % 5;
    const int64_t full_row = (local_row / 2) * 4 + local_row % 2;
    CHECK(full[size_t(l)] == full_row * 5 + col);
  }
  // A part of the local elements: runs start and end inside blocks.
  const auto part = rows.runs(7, 9);
  REQUIRE(part.size() == 2);
  CHECK(part[0].local == 7);
  CHECK(part[0].full == 7);
  CHECK(part[0].numel == 3);
  CHECK(part[1].local == 10);
  CHECK(part[1].full == 20);
  CHECK(part[1].numel == 6);

  // Columns [3, 6) of a (4, 8) weight: one run per row.
  nn::ParallelSlice cols{Shape{4, 8}, 1, {{3, 6}}};
  CHECK(cols.local_shape() == Shape{4, 3});
  const auto runs = cols.runs(2, 7);  // local elements 2..8
  REQUIRE(runs.size() == 3);
  CHECK(runs[0].full == 5);
  CHECK(runs[0].numel == 1);
  CHECK(runs[1].full == 11);
  CHECK(runs[1].numel == 3);
  CHECK(runs[2].full == 19);
  CHECK(runs[2].numel == 3);

  // Replicated rows (a key/value head on 2 ranks): its runs carry the count, and only the
  // first rank of each aligned block of 2 owns them.
  nn::ParallelSlice kv{Shape{12, 5}, 0, {{0, 2}, {4, 6}, {8, 10}}, {1, 2, 2}};
  kv.check();
  const auto all = kv.runs(0, 30);
  REQUIRE(all.size() == 3);
  CHECK(all[0].replicas == 1);
  CHECK(all[1].replicas == 2);
  CHECK(kv.owned_runs(0, 30, 2).size() == 3);
  const auto not_owner = kv.owned_runs(5, 20, 3);  // local elements 5..24, rank 3 of a block
  REQUIRE(not_owner.size() == 1);
  CHECK(not_owner[0].local == 5);
  CHECK(not_owner[0].numel == 5);
  CHECK_THROWS_AS((nn::ParallelSlice{Shape{12, 5}, 0, {{0, 2}}, {0}}.check()), ShapeError);
  CHECK_THROWS_AS((nn::ParallelSlice{Shape{12, 5}, 0, {{0, 2}}, {1, 2}}.check()), ShapeError);
  CHECK_THROWS_AS((nn::ParallelSlice{Shape{4, 8}, 1, {{3, 9}}}.check()), ShapeError);
  CHECK_THROWS_AS((nn::ParallelSlice{Shape{4, 8}, 0, {{2, 3}, {1, 2}}}.check()), ShapeError);
  CHECK_THROWS_AS(nn::equal_part(0, 10, 0, 4, "ten features"), ShapeError);
}

// The head's 16 rows in chunks of 5 (4 chunks, the last of one row): each chunk merges the
// vocabulary shards' softmax statistics through one all-gather. kv_heads: Llama's (1: fewer
// than the 2 tensor-parallel ranks, replicated).
models::ModelConfig tiny(models::Family family, int64_t kv_heads = 2) {
  models::ModelConfig c = testing::tiny_parallel_model(family, kv_heads);
  c.classifier_chunk_rows = 5;
  return c;
}

using testing::values;

// The local elements of `local`, a slice of `full`, against `full`: equal within rel * the
// largest magnitude of the full tensor (0: bit for bit).
void check_slice(Context& ctx, const nn::Parameter& p, const Tensor& local, const Tensor& full,
                 double rel, const std::string& what) {
  const std::vector<double> l = values(ctx, local), f = values(ctx, full);
  double scale = 0;
  for (double v : f) scale = std::max(scale, std::abs(v));
  std::vector<nn::ParallelSlice::Run> runs;
  if (p.parallel_slice()) {
    runs = p.parallel_slice()->runs(0, p.numel());
  } else {
    runs.push_back({0, 0, p.numel()});
  }
  for (const auto& r : runs)
    for (int64_t i = 0; i < r.numel; ++i) {
      INFO(what << " of " << p.name() << ", local element " << r.local + i);
      CHECK(std::abs(l[size_t(r.local + i)] - f[size_t(r.full + i)]) <= rel * scale);
    }
}

TEST_CASE("tensor-parallel layers equal the whole model (f64)", "[parallel][mpi]") {
  testing::MpiWorld w;  // for the world only; the mesh below splits it
  const int tp = w.size() >= 2 ? 2 : 1;
  Mesh mesh({1, w.size() / tp, 1, 1, tp}, w.size());
  MeshCommunicators comms(w.world, mesh);
  Communicator& tp_comm = comms.axis(MeshAxis::tp);
  CommunicatorParallelGroup group(tp_comm);
  Context ctx;
  const int64_t B = 2, T = 8;
  const std::vector<int32_t> idx = testing::tiny_tokens(B * T, 7, 3), tgt = testing::tiny_tokens(B * T, 5, 1);
  const std::vector<std::pair<models::Family, int64_t>> models_and_kv_heads = {
      {models::Family::GPT2, 0}, {models::Family::Llama, 2}, {models::Family::Llama, 1}};
  for (const auto& [family, kv_heads] : models_and_kv_heads) {
   for (bool sp : {false, true}) {
    for (const char* recompute : {"none", "full"}) {
      INFO(models::family_name(family) << " with " << kv_heads << " kv heads, recompute "
                                       << recompute << ", tp " << tp << (sp ? ", sequence-parallel" : ""));
      auto whole = models::build_model(tiny(family, kv_heads));
      auto split = models::build_model(tiny(family, kv_heads));
      const std::vector<std::string> report =
          apply_tensor_parallel(*split, split->vocabulary_tables(), split->layer_table(), group, sp);
      // qkv, proj, fc, proj per block; the vocabulary: GPT-2's tied wte and its positions,
      // Llama's embedding and head; the final norm's output entering the head.
      if (!sp) CHECK(report.size() == (tp > 1 ? 4u * 2u + 3u : 0u));
      for (auto* m : {whole.get(), split.get()}) {
        nn::materialize(ctx, *m, DType::f64, 1234);
        models::set_activation_recompute(*m, models::recompute_from_name(recompute));
      }
      auto run = [&](models::LanguageModel& m) {
        autograd::Graph g(ctx);
        Tensor loss = m.forward(g, ops::from_host<int32_t>(ctx, idx, Shape{B, T}),
                                ops::from_host<int32_t>(ctx, tgt, Shape{B, T}), B * T);
        g.backward(loss);
        return ops::item(ctx, loss);
      };
      const double want = run(*whole);
      tp_comm.reset_counts();
      const double got = run(*split);
      CHECK(std::abs(got - want) <= 1e-12 * std::abs(want));
      const bool full = std::string(recompute) == "full";
      const Communicator::Counts& n = tp_comm.counts();
      // The vocabulary: the embedding's rows summed (one all-reduce; under sequence
      // parallelism one reduce-scatter), one all-gather of softmax statistics per classifier
      // chunk, and the head input's gradient summed.
      const size_t chunks = 4;
      if (tp == 1) {
        CHECK(n.all_reduce + n.all_gather + n.reduce_scatter == 0);
      } else if (!sp) {
        // Per block (2 blocks): 4 all-reduces, 6 under full recompute.
        CHECK(n.all_reduce == (full ? 6u : 4u) * 2 + 2);
        CHECK(n.all_gather == chunks);
        CHECK(n.reduce_scatter == 0);
      } else {
        // Per block: 2 all-gathers and 2 reduce-scatters forward, the same backward plus the
        // column-parallel layers' inputs gathered again (2 all-gathers; and the forward's
        // again under full recompute); the embedding's reduce-scatter (its backward one
        // all-gather), the head input's gather one all-gather, its gradient one
        // reduce-scatter.
        CHECK(n.all_gather == (full ? 8u : 6u) * 2 + 2 + chunks);
        CHECK(n.reduce_scatter == (full ? 6u : 4u) * 2 + 2);
        CHECK(n.all_reduce == 0);
      }
      const std::vector<nn::Parameter*> wp = whole->named_parameters(), pp = split->named_parameters();
      REQUIRE(wp.size() == pp.size());
      for (size_t i = 0; i < wp.size(); ++i) {
        REQUIRE(wp[i]->name() == pp[i]->name());
        CHECK(pp[i]->full_shape() == wp[i]->shape());
        const std::string& name = pp[i]->name();
        const bool partial_in_sp = name.find("norm") != std::string::npos ||
                                   name.find("ln_") != std::string::npos ||
                                   name.find("proj.bias") != std::string::npos;
        // GPT-2's positions are added (and get their gradient) on rank 0 only.
        CHECK(pp[i]->placement().partial_grad ==
              (tp > 1 && ((sp && partial_in_sp) || name == "wpe.weight")));
        const bool vocabulary = name == "wte.weight" || name == "embed.weight" || name == "lm_head.weight";
        CHECK((pp[i]->placement().vocabulary_group != nullptr) == (tp > 1 && vocabulary));
        // What sees only this rank's tokens holds a partial gradient: FSDP sums it over the
        // group (ShardedModel::finish_grad_sync); here the test does.
        // (A rank that computed none of it, as for GPT-2's positions off rank 0, adds zeros.)
        if (pp[i]->placement().partial_grad)
          tp_comm.all_reduce(pp[i]->grad_for_accumulation(ctx), ReduceOp::Sum, ctx.stream());
        // A replicated key/value head (on both ranks here): each rank's gradient is the part
        // from its query heads.
        if (pp[i]->parallel_slice()) {
          const Tensor flat = pp[i]->grad.view(Shape{pp[i]->numel()});
          for (const auto& run : pp[i]->parallel_slice()->runs(0, pp[i]->numel())) {
            if (run.replicas == 1) continue;
            REQUIRE(run.replicas == tp);
            tp_comm.all_reduce(flat.narrow(0, run.local, run.numel), ReduceOp::Sum, ctx.stream());
          }
        }
        check_slice(ctx, *pp[i], pp[i]->data, wp[i]->data, 0.0, "initial weights");
        check_slice(ctx, *pp[i], pp[i]->grad, wp[i]->grad, 1e-12, "gradient");
      }
    }
   }
  }
}

// The tensor- and sequence-parallel ops on CUDA: enter, leave and the sequence's split and
// gather (copies through a group of one), then the bias added through a zero-stride view of
// it, and back: identity, and the bias's column sums.
TEST_CASE("CUDA tensor-parallel ops match the CPU's", "[parallel][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  testing::LocalGroup group;
  const Shape shape{3, 5, 24};
  std::vector<double> y_values(size_t(shape.numel())), d_values(y_values.size()), b_values(24);
  for (size_t i = 0; i < y_values.size(); ++i) {
    y_values[i] = std::sin(0.37 * double(i));
    d_values[i] = std::cos(0.11 * double(i));
  }
  for (size_t i = 0; i < b_values.size(); ++i) b_values[i] = 0.1 * double(i) - 1.0;
  struct Out {
    std::vector<double> y, dy, db;
  };
  auto run = [&](Context& ctx) {
    nn::Parameter bias("bias", Shape{24}, nn::InitRule::zeros(), false);
    bias.data = ops::from_vector(ctx, b_values, Shape{24}, DType::f32);
    autograd::Graph g(ctx);
    const Tensor y = autograd::Graph::leaf(ops::from_vector(ctx, y_values, shape, DType::f32));
    // Both regions, plain and along the sequence (a group of one: the same values through
    // the gathers' and scatters' permuted copies).
    const Tensor x = nn::tensor_parallel_enter(g, nn::sequence_split(g, y, group), group, true);
    const Tensor z = nn::tensor_parallel_enter(g, nn::tensor_parallel_leave(g, x, group, true), group);
    const Tensor out = nn::add_bias(g, nn::sequence_gather(g, nn::tensor_parallel_leave(g, z, group), group), bias);
    g.backward(out, ops::from_vector(ctx, d_values, shape, DType::f32));
    return Out{values(ctx, out), values(ctx, autograd::Graph::grad(y)), values(ctx, bias.grad)};
  };
  const Out want = run(cpu), got = run(gpu);
  REQUIRE(got.y.size() == want.y.size());
  for (size_t i = 0; i < want.y.size(); ++i) {
    CHECK(got.y[i] == want.y[i]);  // one f32 addition each
    CHECK(got.dy[i] == want.dy[i]);
  }
  for (size_t i = 0; i < want.db.size(); ++i) CHECK(got.db[i] == Approx(want.db[i]).epsilon(1e-5));
}

// This process's NCCL world: a real group of one for the GPU cases.
std::unique_ptr<World> nccl_world() {
  WorldOptions options;
  options.backend = backend_from_name(testing::gpu_backend_name(), "FSDP_TEST_GPU_BACKEND");
  options.print_summary = false;
  return std::make_unique<World>(options);
}

// Column-parallel layers with their exchanges inside (ColumnParallelInput: the backward
// gathers the input again beside the input-gradient product, then sums that gradient beside
// the weight-gradient product) through a group of one: on CUDA exactly the plain layer's
// numbers, through a copying group and through a real NCCL group whose exchanges run on its
// own stream; and within f32 rounding of the CPU's.
TEST_CASE("CUDA column-parallel linear and MLP equal the plain ones, also over NCCL", "[parallel][gpu]") {
  FSDP_REQUIRE_GPU();
  Context cpu, gpu(Device::cuda(0));
  testing::LocalGroup local;
  const std::unique_ptr<World> world = nccl_world();
  if (world->size() != 1) return;  // a group of one: this process alone
  CommunicatorParallelGroup nccl_group(world->comm());
  const int64_t B = 2, T = 16, C = 32, F = 48;
  auto wave = [](int64_t n, double a, double scale) {
    std::vector<double> v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = scale * std::sin(a * double(i) + 0.3);
    return v;
  };
  const std::vector<double> x = wave(B * T * C, 0.37, 1.0), w_fc = wave(F * C, 0.21, 0.2),
                            w_proj = wave(C * F, 0.13, 0.2), b_fc = wave(F, 0.7, 0.1),
                            dy_lin = wave(B * T * F, 0.11, 1.0), dy_mlp = wave(B * T * C, 0.17, 1.0);
  auto param = [](Context& ctx, const char* name, const std::vector<double>& v, Shape shape) {
    auto p = std::make_unique<nn::Parameter>(name, shape, nn::InitRule::zeros(), true);
    p->data = ops::from_vector(ctx, v, shape, DType::f32);
    return p;
  };
  // Outputs and every gradient of a GELU linear and a GELU MLP on x.
  auto run = [&](Context& ctx, nn::ParallelGroup* group, bool sequence) {
    std::vector<std::vector<double>> out;
    const nn::ColumnParallelInput column{group, sequence};
    auto fc = param(ctx, "fc", w_fc, Shape{F, C}), bias = param(ctx, "fc_bias", b_fc, Shape{F});
    auto proj = param(ctx, "proj", w_proj, Shape{C, F});
    {
      autograd::Graph g(ctx);
      const Tensor in = autograd::Graph::leaf(ops::from_vector(ctx, x, Shape{B, T, C}, DType::f32));
      const Tensor y = nn::linear(g, in, *fc, bias.get(), ops::Epilogue::Gelu, column);
      g.backward(y, ops::from_vector(ctx, dy_lin, Shape{B, T, F}, DType::f32));
      for (const Tensor& t : {y, autograd::Graph::grad(in), fc->grad, bias->grad}) out.push_back(values(ctx, t));
    }
    {
      autograd::Graph g(ctx);
      const Tensor in = autograd::Graph::leaf(ops::from_vector(ctx, x, Shape{B, T, C}, DType::f32));
      const Tensor y = nn::mlp(g, in, *fc, bias.get(), *proj, nullptr, nn::MlpActivation::Gelu, false, column);
      g.backward(y, ops::from_vector(ctx, dy_mlp, Shape{B, T, C}, DType::f32));
      for (const Tensor& t : {y, autograd::Graph::grad(in), fc->grad, bias->grad, proj->grad})
        out.push_back(values(ctx, t));
    }
    return out;
  };
  const auto plain_cpu = run(cpu, nullptr, false), plain = run(gpu, nullptr, false);
  REQUIRE(plain.size() == 9);
  for (size_t k = 0; k < plain.size(); ++k) {  // f32, sums in another order: 1e-4 of the scale
    double scale = 0;
    for (double v : plain_cpu[k]) scale = std::max(scale, std::abs(v));
    for (size_t i = 0; i < plain[k].size(); ++i) CHECK(std::abs(plain[k][i] - plain_cpu[k][i]) <= 1e-4 * scale);
  }
  for (nn::ParallelGroup* group : {static_cast<nn::ParallelGroup*>(&local),
                                         static_cast<nn::ParallelGroup*>(&nccl_group)}) {
    for (bool sequence : {false, true}) {
      INFO((group == &local ? "copying group" : "NCCL group") << (sequence ? ", sequence-parallel" : ""));
      const auto got = run(gpu, group, sequence);
      REQUIRE(got.size() == plain.size());
      for (size_t k = 0; k < got.size(); ++k) CHECK(got[k] == plain[k]);
    }
  }
}

// FP8 column-parallel layers (nn::linear and nn::mlp with a ColumnParallelInput and an FP8
// recipe split over the group) through a group of one: the backward's own path (the input
// gradient's FP8 product into a buffer of its own, then summed or reduce-scattered; under
// sequence parallelism the input gathered again and cast to FP8 again for the weight
// gradient) gives the plain FP8 layer's outputs and gradients bit for bit, on the CPU's
// simulation of FP8 (f64) and on a GPU (bf16, also through a real NCCL group). The split
// layouts' agreement with the single process is proven on CPU ranks by
// //tests/train:fp8_train_test.

std::vector<double> sine_wave(int64_t n, double a, double scale) {
  std::vector<double> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * std::sin(a * double(i) + 0.3);
  return v;
}

constexpr int64_t kB = 2, kT = 16, kC = 32, kF = 48;  // every size a multiple of 16

// Outputs and every gradient of a GELU linear and a GELU MLP, in `dtype` on ctx's device,
// with their weights in FP8 (hybrid, tensorwise) or not; with a group, column-parallel,
// the FP8 recipes' weights and output gradients split over it.
std::vector<std::vector<double>> run_fp8(Context& ctx, DType dtype, bool fp8,
                                         nn::ParallelGroup* group, bool sequence) {
  const std::vector<double> x = sine_wave(kB * kT * kC, 0.37, 1.0),
                            w_fc = sine_wave(kF * kC, 0.21, 0.2), w_proj = sine_wave(kC * kF, 0.13, 0.2),
                            b_fc = sine_wave(kF, 0.7, 0.1), dy_lin = sine_wave(kB * kT * kF, 0.11, 1.0),
                            dy_mlp = sine_wave(kB * kT * kC, 0.17, 1.0);
  nn::Fp8Recipe recipe;
  recipe.backward = kernels::Fp8Format::e5m2;
  auto param = [&](const char* name, const std::vector<double>& v, Shape shape, bool split) {
    auto p = std::make_unique<nn::Parameter>(name, shape, nn::InitRule::zeros(), true);
    p->data = ops::from_vector(ctx, v, shape, dtype);
    if (fp8 && shape.rank() == 2) {
      nn::Fp8Recipe& r = p->fp8.emplace(nn::Fp8Weight{recipe}).recipe;
      if (split && group) {
        r.feature_group = group;
        r.split[size_t(nn::Fp8Operand::weight)] = nn::Fp8Split::rows;
        r.split[size_t(nn::Fp8Operand::output_grad)] = nn::Fp8Split::columns;
      }
    }
    return p;
  };
  std::vector<std::vector<double>> out;
  const nn::ColumnParallelInput column{group, sequence};
  auto fc = param("fc", w_fc, Shape{kF, kC}, true), bias = param("fc_bias", b_fc, Shape{kF}, false);
  auto proj = param("proj", w_proj, Shape{kC, kF}, false);
  {
    autograd::Graph g(ctx);
    const Tensor in = autograd::Graph::leaf(ops::from_vector(ctx, x, Shape{kB, kT, kC}, dtype));
    const Tensor y = nn::linear(g, in, *fc, bias.get(), ops::Epilogue::Gelu, column);
    g.backward(y, ops::from_vector(ctx, dy_lin, Shape{kB, kT, kF}, dtype));
    for (const Tensor& t : {y, autograd::Graph::grad(in), fc->grad, bias->grad}) out.push_back(values(ctx, t));
  }
  {
    autograd::Graph g(ctx);
    const Tensor in = autograd::Graph::leaf(ops::from_vector(ctx, x, Shape{kB, kT, kC}, dtype));
    const Tensor y = nn::mlp(g, in, *fc, bias.get(), *proj, nullptr, nn::MlpActivation::Gelu, false, column);
    g.backward(y, ops::from_vector(ctx, dy_mlp, Shape{kB, kT, kC}, dtype));
    for (const Tensor& t : {y, autograd::Graph::grad(in), fc->grad, bias->grad, proj->grad})
      out.push_back(values(ctx, t));
  }
  return out;
}

void check_equal(const std::vector<std::vector<double>>& got, const std::vector<std::vector<double>>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    INFO("tensor " << k);
    CHECK(got[k] == want[k]);
  }
}

TEST_CASE("FP8 column-parallel linear and MLP equal the plain FP8 ones (CPU simulation, f64)",
          "[parallel][fp8]") {
  if (testing::world_size() != 1) return;
  Context cpu;
  testing::LocalGroup local;
  const auto plain = run_fp8(cpu, DType::f64, true, nullptr, false);
  // The products are really quantized: the layer's output differs from the f64 one.
  CHECK(plain[0] != run_fp8(cpu, DType::f64, false, nullptr, false)[0]);
  for (bool sequence : {false, true}) {
    INFO((sequence ? "sequence-parallel" : "column-parallel"));
    check_equal(run_fp8(cpu, DType::f64, true, &local, sequence), plain);
  }
}

TEST_CASE("CUDA FP8 column-parallel linear and MLP equal the plain FP8 ones, also over NCCL",
          "[parallel][fp8][gpu]") {
  FSDP_REQUIRE_GPU();
  Context gpu(Device::cuda(0));
  std::string why;
  if (!ops::fp8_available(gpu, &why)) {
    WARN("no FP8 tensor cores: " << why);
    return;
  }
  testing::LocalGroup local;
  const std::unique_ptr<World> world = nccl_world();
  if (world->size() != 1) return;  // a group of one: this process alone
  CommunicatorParallelGroup nccl_group(world->comm());
  const auto plain = run_fp8(gpu, DType::bf16, true, nullptr, false);
  CHECK(plain[0] != run_fp8(gpu, DType::bf16, false, nullptr, false)[0]);
  for (nn::ParallelGroup* group : {static_cast<nn::ParallelGroup*>(&local),
                                         static_cast<nn::ParallelGroup*>(&nccl_group)})
    for (bool sequence : {false, true}) {
      INFO((group == &local ? "copying group" : "NCCL group") << (sequence ? ", sequence-parallel" : ""));
      check_equal(run_fp8(gpu, DType::bf16, true, group, sequence), plain);
    }
}

}  // namespace
