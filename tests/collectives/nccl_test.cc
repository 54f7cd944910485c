// The device backends on GPUs, under mpirun -np 2 on the GPU machine (skipped without a
// GPU): every collective x dtype with poisoned outputs, in place, prescale and avg, groups,
// counts and hash, split and mesh communicators, and the watchdog. NCCL by default (one GPU
// per rank); FSDP_TEST_GPU_BACKEND=staged runs the same cases with the ranks sharing a GPU.
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/mesh.h"
#include "collectives/world.h"
#include "runtime/core/context.h"
#include "tests/collectives/collective_checks.h"
#include "tests/test_support.h"

namespace fsdp {
namespace {

using Catch::Matchers::Contains;
using testing::expected_reduction;
using testing::first_mismatch;
using testing::HostBuffer;
using testing::sample;
using testing::tested_dtypes;
using namespace std::chrono_literals;

const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};

std::unique_ptr<World> nccl_world(std::chrono::milliseconds timeout = 120s,
                                  std::function<void(const std::string&)> on_failure = nullptr) {
  WorldOptions options;
  options.backend = backend_from_name(testing::gpu_backend_name(), "FSDP_TEST_GPU_BACKEND");
  options.print_summary = testing::world_rank() == 0;
  options.timeout = timeout;
  options.on_failure = std::move(on_failure);
  return std::make_unique<World>(options);
}

Tensor host_view(HostBuffer& b) {
  return Tensor::from_storage(Storage::wrap(b.data(), b.nbytes(), Device::cpu()),
                              Shape{int64_t(b.size())}, b.dtype());
}

// A device copy of a host buffer.
Tensor upload(Context& ctx, HostBuffer& host) {
  Tensor dev = ctx.empty(Shape{int64_t(host.size())}, host.dtype());
  copy_bytes(dev, host_view(host), ctx.stream());
  return dev;
}

// The device tensor's bytes, on the host, once the stream has finished.
HostBuffer download(Context& ctx, const Tensor& dev) {
  HostBuffer host(dev.dtype(), size_t(dev.numel()));
  ctx.stream().synchronize();
  copy_bytes(host_view(host), dev, ctx.stream());
  ctx.stream().synchronize();
  return host;
}

bool reducible(DType dt) { return dt != DType::u16; }  // NCCL has no 16-bit integer type

TEST_CASE("NCCL: every collective x dtype, out of place and in place", "[gpu]") {
  FSDP_REQUIRE_GPU();
  auto world = nccl_world();
  Communicator& comm = world->comm();
  Context ctx(world->device());
  const Stream& s = ctx.stream();
  const int n = comm.size(), me = comm.rank();
  const size_t count = 1000;
  for (DType dt : tested_dtypes()) {
    for (bool in_place : {false, true}) {
      INFO(dtype_name(dt) << (in_place ? " in place" : ""));
      // all_gather
      HostBuffer mine(dt, count), gathered(dt, count * n), want(dt, count * n);
      for (size_t i = 0; i < count; ++i) mine.set(i, sample(dt, me, i));
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i) want.set(r * count + i, sample(dt, r, i));
      }
      gathered.poison();
      std::memcpy(gathered.element(me * count), mine.data(), mine.nbytes());
      Tensor out = upload(ctx, gathered);
      Tensor in = upload(ctx, mine);
      const void* send = in_place ? static_cast<char*>(out.data_ptr()) + me * mine.nbytes()
                                  : in.data_ptr();
      Work w = comm.all_gather(send, out.data_ptr(), count, dt, s);
      w.wait(s);
      REQUIRE(first_mismatch(download(ctx, out), want) == "");
      CHECK(w.done());

      // broadcast from every root
      for (int root = 0; root < n; ++root) {
        HostBuffer buf(dt, count), from_root(dt, count);
        for (size_t i = 0; i < count; ++i) from_root.set(i, sample(dt, root, i));
        if (me == root) {
          std::memcpy(buf.data(), from_root.data(), buf.nbytes());
        } else {
          buf.poison();
        }
        Tensor b = upload(ctx, buf);
        comm.broadcast(b, root, s);
        REQUIRE(first_mismatch(download(ctx, b), from_root) == "");
      }
      if (!reducible(dt)) continue;
      for (ReduceOp op : kOps) {
        INFO(reduce_op_name(op));
        // reduce_scatter
        HostBuffer full(dt, count * n), shard(dt, count), shard_want(dt, count);
        for (size_t j = 0; j < count * n; ++j) full.set(j, sample(dt, me, j));
        for (size_t i = 0; i < count; ++i) {
          std::vector<double> values;
          for (int r = 0; r < n; ++r) values.push_back(sample(dt, r, me * count + i));
          shard_want.set(i, expected_reduction(dt, op, 1.0, values));
        }
        shard.poison();
        Tensor dfull = upload(ctx, full), dshard = upload(ctx, shard);
        char* chunk = static_cast<char*>(dfull.data_ptr()) + me * shard.nbytes();
        comm.reduce_scatter(dfull.data_ptr(), in_place ? chunk : dshard.data_ptr(), count, dt, op,
                            s);
        HostBuffer got_full = download(ctx, dfull);
        HostBuffer got(dt, count);
        if (in_place) {
          std::memcpy(got.data(), got_full.element(me * count), got.nbytes());
        } else {
          got = download(ctx, dshard);
        }
        REQUIRE(first_mismatch(got, shard_want) == "");

        // all_reduce
        HostBuffer x(dt, count), y(dt, count), sum_want(dt, count);
        for (size_t i = 0; i < count; ++i) {
          x.set(i, sample(dt, me, i));
          std::vector<double> values;
          for (int r = 0; r < n; ++r) values.push_back(sample(dt, r, i));
          sum_want.set(i, expected_reduction(dt, op, 1.0, values));
        }
        y.poison();
        Tensor dx = upload(ctx, x), dy = upload(ctx, y);
        comm.all_reduce(dx.data_ptr(), in_place ? dx.data_ptr() : dy.data_ptr(), count, dt, op, s);
        REQUIRE(first_mismatch(download(ctx, in_place ? dx : dy), sum_want) == "");
      }
    }
  }
  // NCCL has no 16-bit integers; the staged backend reduces them as the MPI one does.
  if (world->backend() == Backend::Nccl) {
    HostBuffer halves(DType::u16, 4);
    CHECK_THROWS_AS(comm.all_reduce(upload(ctx, halves), ReduceOp::Sum, s), DTypeError);
  }
}

TEST_CASE("NCCL: prescale (pre-multiplied sum) and avg", "[gpu]") {
  FSDP_REQUIRE_GPU();
  auto world = nccl_world();
  Communicator& comm = world->comm();
  Context ctx(world->device());
  const int n = comm.size(), me = comm.rank();
  const size_t count = 513;
  for (DType dt : tested_dtypes()) {
    if (!reducible(dt)) continue;
    const double prescale = is_floating(dt) ? 0.25 : 3.0;
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      if (op == ReduceOp::Avg && !is_floating(dt)) continue;  // NCCL cannot fold it in
      INFO(dtype_name(dt) << " " << reduce_op_name(op));
      HostBuffer x(dt, count), want(dt, count);
      for (size_t i = 0; i < count; ++i) {
        x.set(i, sample(dt, me, i));
        std::vector<double> values;
        for (int r = 0; r < n; ++r) values.push_back(sample(dt, r, i));
        want.set(i, expected_reduction(dt, op, prescale, values));
      }
      Tensor dx = upload(ctx, x);
      comm.all_reduce(dx, op, ctx.stream(), prescale);
      REQUIRE(first_mismatch(download(ctx, dx), want) == "");

      HostBuffer full(dt, count * n), shard(dt, count), shard_want(dt, count);
      for (size_t j = 0; j < count * n; ++j) full.set(j, sample(dt, me, j));
      for (size_t i = 0; i < count; ++i) {
        std::vector<double> values;
        for (int r = 0; r < n; ++r) values.push_back(sample(dt, r, me * count + i));
        shard_want.set(i, expected_reduction(dt, op, prescale, values));
      }
      shard.poison();
      Tensor dfull = upload(ctx, full), dshard = upload(ctx, shard);
      comm.reduce_scatter(dshard, dfull, op, ctx.stream(), prescale);
      REQUIRE(first_mismatch(download(ctx, dshard), shard_want) == "");
    }
  }
}

TEST_CASE("NCCL: groups of send/recv and collectives; Work after group_end", "[gpu]") {
  FSDP_REQUIRE_GPU();
  auto world = nccl_world();
  Communicator& comm = world->comm();
  Context ctx(world->device());
  const Stream& s = ctx.stream();
  const int n = comm.size(), me = comm.rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  HostBuffer mine(DType::bf16, 4096), theirs(DType::bf16, 4096), want(DType::bf16, 4096);
  for (size_t i = 0; i < 4096; ++i) {
    mine.set(i, sample(DType::bf16, me, i));
    want.set(i, sample(DType::bf16, prev, i));
  }
  theirs.poison();
  Tensor dsend = upload(ctx, mine), drecv = upload(ctx, theirs);
  HostBuffer ones(DType::f32, 64);
  for (size_t i = 0; i < 64; ++i) ones.set(i, 1.0);
  Tensor dones = upload(ctx, ones);
  comm.group_start();
  comm.send(dsend.data_ptr(), 4096, DType::bf16, next, s);
  Work r = comm.recv(drecv.data_ptr(), 4096, DType::bf16, prev, s);
  Work a = comm.all_reduce(dones, ReduceOp::Sum, s);
  CHECK_THROWS_AS(r.wait(s), ValueError);
  CHECK_FALSE(r.done());
  comm.group_end();
  r.synchronize();
  a.synchronize();
  CHECK(r.done());
  REQUIRE(first_mismatch(download(ctx, drecv), want) == "");
  HostBuffer total = download(ctx, dones);
  for (size_t i = 0; i < 64; ++i) REQUIRE(total.get(i) == double(n));
}

// Expert parallelism's exchange: rank s sends (s + 2 p + 1) % 4 * 1000 bf16 values to rank p
// (uneven, some parts empty, one part to itself).
TEST_CASE("NCCL: all_to_all with uneven and empty parts", "[gpu]") {
  FSDP_REQUIRE_GPU();
  auto world = nccl_world();
  Communicator& comm = world->comm();
  Context ctx(world->device());
  const int n = comm.size(), me = comm.rank();
  auto count = [](int s, int p) { return size_t((s + 2 * p + 1) % 4) * 1000; };
  std::vector<size_t> send_counts, recv_counts;
  size_t sent = 0, received = 0;
  for (int p = 0; p < n; ++p) {
    send_counts.push_back(count(me, p));
    recv_counts.push_back(count(p, me));
    sent += send_counts.back();
    received += recv_counts.back();
  }
  HostBuffer mine(DType::bf16, sent), theirs(DType::bf16, received), want(DType::bf16, received);
  size_t at = 0;
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < count(me, p); ++i) mine.set(at++, sample(DType::bf16, me * 16 + p, i));
  at = 0;
  for (int s = 0; s < n; ++s)
    for (size_t i = 0; i < count(s, me); ++i) want.set(at++, sample(DType::bf16, s * 16 + me, i));
  theirs.poison();
  Tensor dsend = upload(ctx, mine), drecv = upload(ctx, theirs);
  comm.reset_counts();
  Work w = comm.all_to_all(sent ? dsend.data_ptr() : nullptr, send_counts,
                           received ? drecv.data_ptr() : nullptr, recv_counts, DType::bf16,
                           ctx.stream());
  w.synchronize();
  CHECK(comm.counts().all_to_all == 1);
  REQUIRE(first_mismatch(download(ctx, drecv), want) == "");
}

TEST_CASE("NCCL: counts, hash, barrier, split and mesh communicators", "[gpu]") {
  FSDP_REQUIRE_GPU();
  auto world = nccl_world();
  Context ctx(world->device());
  const int n = world->size(), me = world->rank();
  Communicator& comm = world->comm();
  CHECK(std::string(comm.backend()) == testing::gpu_backend_name());
  CHECK(comm.device() == world->device());
  HostBuffer x(DType::f32, 256);
  Tensor dx = upload(ctx, x);
  comm.reset_counts();
  comm.all_reduce(dx, ReduceOp::Sum, ctx.stream());
  comm.broadcast(dx, 0, ctx.stream());
  comm.barrier();
  CHECK(comm.counts().all_reduce == 1);
  CHECK(comm.counts().broadcast == 1);
  CHECK(comm.counts().barrier == 1);
  CHECK(comm.counts().bytes == 2 * 256 * 4);
  uint64_t hash = comm.schedule_hash(), other = 0;
  MPI_Allreduce(&hash, &other, 1, MPI_UINT64_T, MPI_BXOR, MPI_COMM_WORLD);
  CHECK(other == (n % 2 == 0 ? 0 : hash));  // equal on every rank

  const Mesh mesh({1, -1, 1, 1, 1}, n);
  MeshCommunicators comms(*world, mesh);
  for (Communicator* c : {&comms.all_gather_comm(DpGroup::dp_shard),
                          &comms.reduce_scatter_comm(DpGroup::dp_shard),
                          &comms.reduce_scatter_comm(DpGroup::dp), &comms.axis(MeshAxis::tp)}) {
    INFO(c->name());
    HostBuffer v(DType::i64, 8), want(DType::i64, 8);
    int64_t sum = 0;
    for (int r : (c->size() == 1 ? std::vector<int>{me} : mesh.dp_group(me))) sum += r;
    for (size_t i = 0; i < 8; ++i) {
      v.set(i, double(me));
      want.set(i, double(sum));
    }
    Tensor dv = upload(ctx, v);
    c->all_reduce(dv, ReduceOp::Sum, ctx.stream()).synchronize();
    REQUIRE(first_mismatch(download(ctx, dv), want) == "");
  }
}

TEST_CASE("NCCL: the watchdog turns a collective one rank skips into a TimeoutError", "[gpu]") {
  FSDP_REQUIRE_GPU();
  if (testing::world_size() < 2) {
    testing::mark_skipped("needs at least 2 ranks");
    return;
  }
  // The failure listener (tools end the process from there) hears the first failure once.
  auto heard = std::make_shared<std::vector<std::string>>();
  auto heard_mu = std::make_shared<std::mutex>();
  auto world = nccl_world(3s, [heard, heard_mu](const std::string& m) {
    std::lock_guard<std::mutex> lock(*heard_mu);
    heard->push_back(m);
  });
  auto comm = world->split("dp_shard/rs", 0, world->rank());
  world->set_step(3);
  // On the hung rank nothing below is torn down: after ncclCommAbort the hung kernel may
  // keep spinning, and a Context's stream synchronize or a cudaFree would wait for it
  // forever (tools end such a process from the failure listener; a test cannot). The
  // process's exit ends the kernel.
  auto* ctx_owner = new Context(world->device());
  Context& ctx = *ctx_owner;
  HostBuffer x(DType::f32, 1024);
  Tensor dx = upload(ctx, x);
  // Both ranks take part once, so the communicator's connections exist: what hangs below
  // is the kernel waiting for its peer, as when a rank stops mid-training.
  comm->all_reduce(dx, ReduceOp::Sum, ctx.stream()).synchronize();
  if (world->rank() == 0) {
    const auto start = std::chrono::steady_clock::now();
    Work w = comm->all_reduce(dx, ReduceOp::Sum, ctx.stream());
    std::string message;
    try {
      w.synchronize();
      FAIL("the collective finished without rank 1");
    } catch (const TimeoutError& e) {
      message = e.what();
    }
    const auto elapsed = std::chrono::steady_clock::now() - start;
    CHECK(elapsed >= 3s);
    CHECK(elapsed < 8s);
    CHECK_THAT(message, Contains("all_reduce of 1024 x f32") &&
                            Contains("group 'dp_shard/rs'") && Contains("step 3"));
    CHECK_THROWS_AS(comm->all_reduce(dx, ReduceOp::Sum, ctx.stream()), TimeoutError);
    CHECK_THROWS_AS(world->check_health(), TimeoutError);
    std::lock_guard<std::mutex> lock(*heard_mu);
    REQUIRE(heard->size() == 1);
    CHECK(heard->front() == message);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // The staged backend's rank 0 left an MPI request open for the peers' part: once it has
  // timed out (it is past the barrier), they take part late, so that every rank can end
  // cleanly (rank 0 progresses the request in the next barrier).
  if (world->rank() != 0 && world->backend() == Backend::Staged) {
    comm->all_reduce(dx, ReduceOp::Sum, ctx.stream()).synchronize();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // The other ranks end their communicators too (abort, not a destroy that waits for peers).
  if (world->rank() != 0) world->abort("the watchdog test is over");
  MPI_Barrier(MPI_COMM_WORLD);
  if (world->rank() == 0) {
    (void)new Tensor(dx);  // its storage would return to the leaked Context's allocator
    (void)comm.release();
    (void)world.release();
  } else {
    delete ctx_owner;
  }
}

// More ranks than GPUs (the one-GPU machine under mpirun -np 2): NCCL is refused before it
// starts, naming the two ranks and the backend that lets them share, and the staged world
// counts every rank on the GPU.
TEST_CASE("NCCL refuses ranks that share a GPU, by name; the staged backend counts them",
          "[gpu]") {
  FSDP_REQUIRE_GPU();
  if (testing::world_size() <= cuda_device_count()) {
    testing::mark_skipped("every rank has a GPU of its own");
    return;
  }
  WorldOptions options;
  options.backend = Backend::Nccl;
  options.print_summary = false;
  try {
    World refused(options);
    FAIL("NCCL started with two ranks on one GPU");
  } catch (const LaunchError& e) {
    CHECK_THAT(e.what(), Contains("ranks 0 and ") && Contains("are on the same GPU") &&
                             Contains("dist.backend=staged"));
  }
  options.backend = Backend::Staged;
  World staged(options);
  int on_mine = 0;
  for (int r = 0; r < staged.size(); ++r) {
    on_mine += r % cuda_device_count() == staged.rank() % cuda_device_count() ? 1 : 0;
  }
  CHECK(staged.ranks_on_device() == on_mine);
  CHECK_THAT(staged.summary(), Contains(str_cat("shared by ", on_mine, " ranks")));
}

}  // namespace
}  // namespace fsdp
