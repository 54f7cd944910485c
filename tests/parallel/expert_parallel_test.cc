// Expert parallelism's exchanges under mpirun -np 1/2/4 (f64, CPU ranks): every rank routes
// its own rows to experts that the ranks hold in equal parts (plan_expert_exchange, then the
// rows to the experts' ranks), each rank runs its experts (a grouped matmul) on the rows it
// receives, and the results come home; the backward sends the gradients the same two ways,
// as the MoE layer does. The outputs, the rows' gradients and the expert weights' gradients
// must equal what one process computes with every expert and every rank's rows (gathered
// here with plain MPI).
#include <mpi.h>

#include <cmath>
#include <memory>
#include <vector>

#include "collectives/mesh.h"
#include "collectives/world.h"
#include "kernels/ops.h"
#include "runtime/autograd/graph.h"
#include "runtime/nn/expert_parallel.h"
#include "runtime/nn/init.h"
#include "runtime/nn/moe.h"
#include "runtime/parallel/expert_parallel.h"
#include "tests/mpi_world.h"
#include "tests/test_support.h"

using namespace fsdp;

namespace {

// Rank s's rows for expert e: (s + 2 e) % 3 of them (zero for some).
int64_t rows_of(int s, int64_t e) { return (s + 2 * e) % 3; }

double value(int s, int64_t row, int64_t c) { return std::sin(0.3 * double(s * 1000 + row * 17 + c)); }

std::vector<double> all_gather_doubles(const std::vector<double>& mine, int n) {
  std::vector<int> sizes(static_cast<size_t>(n)), offsets(static_cast<size_t>(n));
  const int size = int(mine.size());
  MPI_Allgather(&size, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int total = 0;
  for (int s = 0; s < n; ++s) offsets[size_t(s)] = total, total += sizes[size_t(s)];
  std::vector<double> all(static_cast<size_t>(total));
  MPI_Allgatherv(mine.data(), size, MPI_DOUBLE, all.data(), sizes.data(), offsets.data(),
                 MPI_DOUBLE, MPI_COMM_WORLD);
  return all;
}

TEST_CASE("expert exchanges to the experts' ranks and back equal one process holding every "
          "expert (f64)", "[parallel][mpi]") {
  testing::MpiWorld w;
  const int n = w.size(), me = w.rank();
  Communicator& comm = w.world.comm();
  CommunicatorExpertParallelGroup group(comm);
  Context ctx;
  const int64_t E = 8, C = 6, F = 5;
  const auto layout = nn::ExpertParallelLayout::make(E, n, me);
  const int64_t local = layout.local_experts();
  // Every expert's weight (E, F, C), the same on every rank; this rank holds its part.
  std::vector<double> w_all(static_cast<size_t>(E * F * C));
  for (size_t i = 0; i < w_all.size(); ++i) w_all[i] = std::cos(0.07 * double(i));
  const Tensor w_full = ops::from_vector(ctx, w_all, Shape{E, F, C}, DType::f64);
  const Tensor w_local = ops::clone(ctx, w_full.narrow(0, layout.first_expert(me), local));
  // This rank's rows grouped by expert, and the output gradient.
  std::vector<int64_t> counts;
  int64_t rows = 0;
  for (int64_t e = 0; e < E; ++e) counts.push_back(rows_of(me, e)), rows += counts.back();
  std::vector<double> xs, dys;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < C; ++c) xs.push_back(value(me, r, c));
    for (int64_t f = 0; f < F; ++f) dys.push_back(value(me + 7, r, f));
  }

  const Tensor x = ops::from_vector(ctx, xs, Shape{rows, C}, DType::f64);
  comm.reset_counts();
  const std::shared_ptr<const nn::ExpertExchange> plan =
      nn::plan_expert_exchange(ctx, counts, layout, group);
  const std::vector<int64_t>& mine_counts = plan->regroup.expert_counts;
  // Forward: the rows to their experts, y = x_e w_e^T per local expert, and home.
  const Tensor at_experts = nn::rows_to_experts(ctx, group, *plan, x);
  const Tensor y_local = ctx.empty(Shape{at_experts.size(0), F}, DType::f64);
  ops::moe_grouped_matmul(ctx, y_local, at_experts, w_local, mine_counts);
  const Tensor y = nn::rows_from_experts(ctx, group, *plan, y_local);
  REQUIRE(y.size(0) == rows);
  // Backward: the output gradient to the experts, through their matmul, and home.
  const Tensor dy_local =
      nn::rows_to_experts(ctx, group, *plan, ops::from_vector(ctx, dys, Shape{rows, F}, DType::f64));
  const Tensor dx_local = ctx.empty(at_experts.shape(), DType::f64);
  const Tensor dw_local = ops::zeros(ctx, w_local.shape(), DType::f64);
  ops::moe_grouped_matmul_backward(ctx, dx_local, dw_local, dy_local, at_experts, w_local,
                                   mine_counts, true);
  const Tensor dx = nn::rows_from_experts(ctx, group, *plan, dx_local);
  // One exchange of counts and one of rows each way, forward and backward.
  CHECK(comm.counts().all_to_all == 5);

  // The single process: every rank's rows, every expert.
  const std::vector<double> got_y = ops::to_vector<double>(ctx, y);
  const std::vector<double> got_dx = ops::to_vector<double>(ctx, dx);
  for (int64_t r = 0, e = 0, left = counts[0]; r < rows; ++r, --left) {
    while (left == 0) left = counts[size_t(++e)];
    for (int64_t f = 0; f < F; ++f) {
      double want = 0;
      for (int64_t c = 0; c < C; ++c) want += xs[size_t(r * C + c)] * w_all[size_t((e * F + f) * C + c)];
      CHECK(std::abs(got_y[size_t(r * F + f)] - want) <= 1e-13);
    }
    for (int64_t c = 0; c < C; ++c) {
      double want = 0;
      for (int64_t f = 0; f < F; ++f) want += dys[size_t(r * F + f)] * w_all[size_t((e * F + f) * C + c)];
      CHECK(std::abs(got_dx[size_t(r * C + c)] - want) <= 1e-13);
    }
  }
  // dW_e = the sum over every rank's rows of expert e of dy^T x.
  const std::vector<double> all_x = all_gather_doubles(xs, n), all_dy = all_gather_doubles(dys, n);
  std::vector<double> want_dw(static_cast<size_t>(E * F * C), 0.0);
  int64_t row = 0;
  for (int s = 0; s < n; ++s)
    for (int64_t e = 0; e < E; ++e)
      for (int64_t i = 0; i < rows_of(s, e); ++i, ++row)
        for (int64_t f = 0; f < F; ++f)
          for (int64_t c = 0; c < C; ++c)
            want_dw[size_t((e * F + f) * C + c)] += all_dy[size_t(row * F + f)] * all_x[size_t(row * C + c)];
  const std::vector<double> got_dw = ops::to_vector<double>(ctx, dw_local);
  for (int64_t i = 0; i < local * F * C; ++i)
    CHECK(std::abs(got_dw[size_t(i)] - want_dw[size_t(layout.first_expert(me) * F * C + i)]) <= 1e-12);
}

// A group of one that copies (the CPU side of the GPU test).
struct LocalExpertGroup : nn::ExpertParallelGroup {
  int size() const override { return 1; }
  int rank() const override { return 0; }
  std::vector<int64_t> exchange_counts(Context&, const std::vector<int64_t>& counts) override {
    return counts;
  }
  void exchange_rows(Context& ctx, const Tensor& send, const std::vector<size_t>&,
                     const Tensor& recv, const std::vector<size_t>&) override {
    ops::copy(ctx, recv, send);
  }
};

// The GPU cases' world: NCCL, quiet.
WorldOptions nccl_options() {
  WorldOptions options;
  options.backend = backend_from_name(testing::gpu_backend_name(), "FSDP_TEST_GPU_BACKEND");
  options.print_summary = false;
  return options;
}

// On one GPU through a real NCCL group of one (the counts through device memory, the rows by
// grouped sends and receives to itself): the exchanges around a grouped matmul, forward and
// backward, against the CPU's.
TEST_CASE("CUDA expert exchanges over NCCL match the CPU's", "[parallel][gpu]") {
  FSDP_REQUIRE_GPU();
  World world(nccl_options());
  if (world.size() != 1) return;  // a group of one: this process alone
  CommunicatorExpertParallelGroup nccl_group(world.comm());
  LocalExpertGroup local_group;
  Context cpu, gpu(world.device());
  const int64_t E = 4, C = 64, F = 32;
  const std::vector<int64_t> counts = {70, 0, 33, 5};
  const int64_t rows = 108;
  std::vector<double> xs(static_cast<size_t>(rows * C)), dys(static_cast<size_t>(rows * F)),
      ws(static_cast<size_t>(E * F * C));
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.37 * double(i));
  for (size_t i = 0; i < dys.size(); ++i) dys[i] = std::cos(0.11 * double(i));
  for (size_t i = 0; i < ws.size(); ++i) ws[i] = 0.1 * std::sin(0.05 * double(i));
  auto run = [&](Context& ctx, nn::ExpertParallelGroup& group) {
    const auto layout = nn::ExpertParallelLayout::make(E, 1, 0);
    const Tensor w = ops::from_vector(ctx, ws, Shape{E, F, C}, DType::f32);
    const Tensor x = ops::from_vector(ctx, xs, Shape{rows, C}, DType::f32);
    const std::shared_ptr<const nn::ExpertExchange> plan =
        nn::plan_expert_exchange(ctx, counts, layout, group);
    const std::vector<int64_t>& c = plan->regroup.expert_counts;
    const Tensor at = nn::rows_to_experts(ctx, group, *plan, x);
    const Tensor y_local = ctx.empty(Shape{rows, F}, DType::f32);
    ops::moe_grouped_matmul(ctx, y_local, at, w, c);
    const Tensor y = nn::rows_from_experts(ctx, group, *plan, y_local);
    const Tensor dy_local =
        nn::rows_to_experts(ctx, group, *plan, ops::from_vector(ctx, dys, Shape{rows, F}, DType::f32));
    const Tensor dx_local = ctx.empty(at.shape(), DType::f32);
    ops::moe_grouped_matmul_backward(ctx, dx_local, Tensor(), dy_local, at, w, c, false);
    const Tensor dx = nn::rows_from_experts(ctx, group, *plan, dx_local);
    return std::make_pair(ops::to_vector<float>(ctx, ops::cast(ctx, y, DType::f32)),
                          ops::to_vector<float>(ctx, dx));
  };
  const auto want = run(cpu, local_group), got = run(gpu, nccl_group);
  REQUIRE(got.first.size() == want.first.size());
  REQUIRE(got.second.size() == want.second.size());
  for (size_t i = 0; i < want.first.size(); ++i) CHECK(got.first[i] == Approx(want.first[i]).margin(1e-4));
  for (size_t i = 0; i < want.second.size(); ++i) CHECK(got.second[i] == Approx(want.second[i]).margin(1e-4));
}

// The MoE layer on one GPU with its shared expert computed while the rows travel over a real
// NCCL group of one that overlaps (the all-to-alls on the group's own stream): the output and
// the input's gradient are the layer's without the group.
TEST_CASE("CUDA MoE layer with the shared expert beside the dispatch matches it without",
          "[parallel][gpu]") {
  FSDP_REQUIRE_GPU();
  World world(nccl_options());
  if (world.size() != 1) return;  // a group of one: this process alone
  CommunicatorExpertParallelGroup nccl_group(world.comm(), true);
  Context gpu(world.device());
  nn::MoeOptions o;
  o.experts = 8;
  o.top_k = 2;
  o.hidden = 96;
  const int64_t B = 2, T = 64, C = 128;
  const nn::InitRule init = nn::InitRule::normal(0, 0.05);
  std::vector<double> xs(static_cast<size_t>(B * T * C)), dys(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.37 * double(i));
  for (size_t i = 0; i < dys.size(); ++i) dys[i] = std::cos(0.11 * double(i));
  auto run = [&](nn::ExpertParallelGroup* group) {
    nn::MoELayer layer(C, o, 160, nn::MlpActivation::SwiGLU, init, init);
    nn::materialize(gpu, layer, DType::f32, 7);
    layer.set_shared_expert_overlap(true);
    if (group) layer.set_expert_parallel(group);
    autograd::Graph g(gpu);
    const Tensor x = autograd::Graph::leaf(ops::from_vector(gpu, xs, Shape{B, T, C}, DType::f32));
    const Tensor y = layer(g, x);
    g.backward(y, ops::from_vector(gpu, dys, Shape{B, T, C}, DType::f32));
    return std::make_pair(ops::to_vector<float>(gpu, y),
                          ops::to_vector<float>(gpu, autograd::Graph::grad(x)));
  };
  const auto want = run(nullptr), got = run(&nccl_group);
  REQUIRE(got.first.size() == want.first.size());
  REQUIRE(got.second.size() == want.second.size());
  for (size_t i = 0; i < want.first.size(); ++i) CHECK(got.first[i] == Approx(want.first[i]).margin(1e-6));
  for (size_t i = 0; i < want.second.size(); ++i) CHECK(got.second[i] == Approx(want.second[i]).margin(1e-6));
}

}  // namespace
