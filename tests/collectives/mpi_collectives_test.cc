// The MPI (CPU) backend under mpirun -np 1/2/4: every collective x dtype, in place, prescale
// and avg, groups, counts and the schedule hash, argument errors, World and mesh
// communicators. Outputs are poisoned before every call and every element is checked.
// Compiled a second time with FSDP_TEST_STAGED=1 (staged_collectives_test): the same cases on
// the staged backend over host buffers, its worker threads and staging included.
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "collectives/comm_memory.h"
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

const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};

#if FSDP_TEST_STAGED
constexpr Backend kBackend = Backend::Staged;
#else
constexpr Backend kBackend = Backend::Mpi;
#endif

std::unique_ptr<World> mpi_world() {
  WorldOptions options;
  options.backend = kBackend;
  options.print_summary = false;
  options.timeout = std::chrono::seconds(120);
  return std::make_unique<World>(options);
}

// Every rank's value of `v`, gathered with plain MPI (independent of the code under test).
std::vector<uint64_t> gather_u64(uint64_t v) {
  std::vector<uint64_t> all(size_t(testing::world_size()));
  MPI_Allgather(&v, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  return all;
}

TEST_CASE("all_gather: every dtype, out of place and in place") {
  auto world = mpi_world();
  Communicator& comm = world->comm();
  const int n = comm.size(), me = comm.rank();
  REQUIRE(n == testing::world_size());
  for (DType dt : tested_dtypes()) {
    for (size_t count : {size_t(1), size_t(37)}) {
      for (bool in_place : {false, true}) {
        INFO(dtype_name(dt) << " count " << count << (in_place ? " in place" : ""));
        HostBuffer send(dt, count), recv(dt, count * n), expected(dt, count * n);
        for (size_t i = 0; i < count; ++i) send.set(i, sample(dt, me, i));
        for (int r = 0; r < n; ++r) {
          for (size_t i = 0; i < count; ++i) expected.set(r * count + i, sample(dt, r, i));
        }
        recv.poison();
        Work work;
        if (in_place) {
          std::memcpy(recv.element(me * count), send.data(), send.nbytes());
          work = comm.all_gather(recv.element(me * count), recv.data(), count, dt, Stream());
        } else {
          work = comm.all_gather(send.data(), recv.data(), count, dt, Stream());
        }
        CHECK(work.done());
        work.synchronize();
        REQUIRE(first_mismatch(recv, expected) == "");
      }
    }
  }
}

TEST_CASE("reduce_scatter: sum, avg, max, min, every dtype, out of place and in place") {
  auto world = mpi_world();
  Communicator& comm = world->comm();
  const int n = comm.size(), me = comm.rank();
  const size_t count = 29;
  for (DType dt : tested_dtypes()) {
    for (ReduceOp op : kOps) {
      for (bool in_place : {false, true}) {
        INFO(dtype_name(dt) << " " << reduce_op_name(op) << (in_place ? " in place" : ""));
        HostBuffer send(dt, count * n), recv(dt, count), expected(dt, count);
        for (size_t j = 0; j < count * n; ++j) send.set(j, sample(dt, me, j));
        for (size_t i = 0; i < count; ++i) {
          std::vector<double> values;
          for (int r = 0; r < n; ++r) values.push_back(sample(dt, r, me * count + i));
          expected.set(i, expected_reduction(dt, op, 1.0, values));
        }
        if (in_place) {
          comm.reduce_scatter(send.data(), send.element(me * count), count, dt, op, Stream());
          std::memcpy(recv.data(), send.element(me * count), recv.nbytes());
        } else {
          recv.poison();
          comm.reduce_scatter(send.data(), recv.data(), count, dt, op, Stream());
        }
        REQUIRE(first_mismatch(recv, expected) == "");
      }
    }
  }
}

TEST_CASE("all_reduce: sum, avg, max, min, every dtype, out of place and in place") {
  auto world = mpi_world();
  Communicator& comm = world->comm();
  const int n = comm.size(), me = comm.rank();
  const size_t count = 41;
  for (DType dt : tested_dtypes()) {
    for (ReduceOp op : kOps) {
      for (bool in_place : {false, true}) {
        INFO(dtype_name(dt) << " " << reduce_op_name(op) << (in_place ? " in place" : ""));
        HostBuffer send(dt, count), recv(dt, count), expected(dt, count);
        for (size_t i = 0; i < count; ++i) {
          send.set(i, sample(dt, me, i));
          std::vector<double> values;
          for (int r = 0; r < n; ++r) values.push_back(sample(dt, r, i));
          expected.set(i, expected_reduction(dt, op, 1.0, values));
        }
        if (in_place) {
          comm.all_reduce(send.data(), send.data(), count, dt, op, Stream());
          REQUIRE(first_mismatch(send, expected) == "");
        } else {
          recv.poison();
          comm.all_reduce(send.data(), recv.data(), count, dt, op, Stream());
          REQUIRE(first_mismatch(recv, expected) == "");
        }
      }
    }
  }
}

TEST_CASE("prescale multiplies every input before the sum; avg divides after it") {
  auto world = mpi_world();
  Communicator& comm = world->comm();
  const int n = comm.size(), me = comm.rank();
  const size_t count = 17;
  for (DType dt : tested_dtypes()) {
    const double prescale = is_floating(dt) ? 0.25 : 3.0;
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      INFO(dtype_name(dt) << " " << reduce_op_name(op) << " prescale " << prescale);
      // all_reduce
      HostBuffer send(dt, count), recv(dt, count), expected(dt, count);
      for (size_t i = 0; i < count; ++i) {
        send.set(i, sample(dt, me, i));
        std::vector<double> values;
        for (int r = 0; r < n; ++r) values.push_back(sample(dt, r, i));
        expected.set(i, expected_reduction(dt, op, prescale, values));
      }
      recv.poison();
      comm.all_reduce(send.data(), recv.data(), count, dt, op, Stream(), prescale);
      REQUIRE(first_mismatch(recv, expected) == "");
      // reduce_scatter
      HostBuffer full(dt, count * n), shard(dt, count), want(dt, count);
      for (size_t j = 0; j < count * n; ++j) full.set(j, sample(dt, me, j));
      for (size_t i = 0; i < count; ++i) {
        std::vector<double> values;
        for (int r = 0; r < n; ++r) values.push_back(sample(dt, r, me * count + i));
        want.set(i, expected_reduction(dt, op, prescale, values));
      }
      shard.poison();
      comm.reduce_scatter(full.data(), shard.data(), count, dt, op, Stream(), prescale);
      REQUIRE(first_mismatch(shard, want) == "");
    }
  }
}

TEST_CASE("bf16 and f32 reductions of arbitrary values are deterministic and rank-ordered") {
  auto world = mpi_world();
  Communicator& comm = world->comm();
  const int n = comm.size(), me = comm.rank();
  const size_t count = 4096;
  // Rank r's inputs come from seed r, so every rank can compute every rank's inputs.
  auto inputs = [&](int rank, DType dt) {
    std::mt19937 gen(1234 + rank);
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    HostBuffer b(dt, count);
    for (size_t i = 0; i < count; ++i) b.set(i, dist(gen));
    return b;
  };
  for (DType dt : {DType::bf16, DType::f32}) {
    INFO(dtype_name(dt));
    HostBuffer mine = inputs(me, dt), out(dt, count), expected(dt, count);
    std::vector<HostBuffer> all;
    for (int r = 0; r < n; ++r) all.push_back(inputs(r, dt));
    for (size_t i = 0; i < count; ++i) {
      float acc = float(all[0].get(i)) * 0.5f;  // f32 accumulation, rank order
      for (int r = 1; r < n; ++r) acc += float(all[r].get(i)) * 0.5f;
      expected.set(i, acc);  // one rounding to the dtype at the end
    }
    out.poison();
    comm.all_reduce(mine.data(), out.data(), count, dt, ReduceOp::Sum, Stream(), 0.5);
    REQUIRE(first_mismatch(out, expected) == "");
    uint64_t hash = 1469598103934665603ull;
    const auto* bytes = static_cast<const unsigned char*>(out.data());
    for (size_t b = 0; b < out.nbytes(); ++b) hash = (hash ^ bytes[b]) * 1099511628211ull;
    for (uint64_t h : gather_u64(hash)) CHECK(h == hash);
  }
}

TEST_CASE("a larger all_reduce and all_gather complete and are exact") {
  auto world = mpi_world();
  Communicator& comm = world->comm();
  const int n = comm.size(), me = comm.rank();
  const size_t count = size_t(1) << 18;
  std::vector<float> send(count), recv(count, -1.0f);
  for (size_t i = 0; i < count; ++i) send[i] = float(int(i % 1000) + me);
  comm.all_reduce(send.data(), recv.data(), count, DType::f32, ReduceOp::Sum, Stream());
  for (size_t i = 0; i < count; ++i) {
    REQUIRE(recv[i] == float(n * int(i % 1000) + n * (n - 1) / 2));
  }
  std::vector<float> gathered(count * n, -1.0f);
  comm.all_gather(send.data(), gathered.data(), count, DType::f32, Stream());
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; i += 997) REQUIRE(gathered[r * count + i] == float(int(i % 1000) + r));
  }
}

TEST_CASE("broadcast from every root") {
  auto world = mpi_world();
  Communicator& comm = world->comm();
  const int n = comm.size(), me = comm.rank();
  for (DType dt : tested_dtypes()) {
    for (int root = 0; root < n; ++root) {
      INFO(dtype_name(dt) << " root " << root);
      HostBuffer buf(dt, 23), expected(dt, 23);
      for (size_t i = 0; i < 23; ++i) expected.set(i, sample(dt, root, i));
      if (me == root) {
        std::memcpy(buf.data(), expected.data(), buf.nbytes());
      } else {
        buf.poison();
      }
      comm.broadcast(buf.data(), 23, dt, root, Stream());
      REQUIRE(first_mismatch(buf, expected) == "");
    }
  }
}

TEST_CASE("send/recv around a ring inside a group; Work is usable only after group_end") {
  auto world = mpi_world();
  Communicator& comm = world->comm();
  const int n = comm.size(), me = comm.rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  for (DType dt : {DType::f32, DType::bf16, DType::i64}) {
    INFO(dtype_name(dt));
    HostBuffer send(dt, 100), recv(dt, 100), expected(dt, 100);
    for (size_t i = 0; i < 100; ++i) {
      send.set(i, sample(dt, me, i));
      expected.set(i, sample(dt, prev, i));
    }
    recv.poison();
    comm.group_start();
    Work s = comm.send(send.data(), 100, dt, next, Stream());
    Work r = comm.recv(recv.data(), 100, dt, prev, Stream());
    CHECK_FALSE(r.done());
    CHECK_THROWS_AS(r.synchronize(), ValueError);
    comm.group_end();
    CHECK(s.done());
    CHECK(r.done());
    r.synchronize();
    REQUIRE(first_mismatch(recv, expected) == "");
  }
}

// Rank s sends this many elements to rank p: uneven, and zero for some pairs.
size_t all_to_all_count(int s, int p) { return size_t((s + 2 * p) % 4) * 3; }

TEST_CASE("all_to_all: uneven and empty parts, every dtype; counts and hash") {
  auto world = mpi_world();
  Communicator& comm = world->comm();
  const int n = comm.size(), me = comm.rank();
  for (DType dt : tested_dtypes()) {
    INFO(dtype_name(dt));
    std::vector<size_t> send_counts(static_cast<size_t>(n)), recv_counts(static_cast<size_t>(n));
    size_t sent = 0, received = 0;
    for (int p = 0; p < n; ++p) {
      send_counts[size_t(p)] = all_to_all_count(me, p);
      recv_counts[size_t(p)] = all_to_all_count(p, me);
      sent += send_counts[size_t(p)];
      received += recv_counts[size_t(p)];
    }
    HostBuffer send(dt, sent), recv(dt, received), expected(dt, received);
    size_t at = 0;
    for (int p = 0; p < n; ++p)  // the part for rank p: values keyed by (me, p)
      for (size_t i = 0; i < send_counts[size_t(p)]; ++i) send.set(at++, sample(dt, me * 16 + p, i));
    at = 0;
    for (int s = 0; s < n; ++s)
      for (size_t i = 0; i < recv_counts[size_t(s)]; ++i) expected.set(at++, sample(dt, s * 16 + me, i));
    recv.poison();
    comm.reset_counts();
    const uint64_t hash = comm.schedule_hash();
    comm.all_to_all(send.data(), send_counts, recv.data(), recv_counts, dt, Stream());
    REQUIRE(first_mismatch(recv, expected) == "");
    CHECK(comm.counts().all_to_all == 1);
    CHECK(comm.counts().bytes == sent * dtype_size(dt));
    // The counts differ between ranks; the schedule does not.
    const std::vector<uint64_t> hashes = gather_u64(comm.schedule_hash());
    CHECK(std::equal(hashes.begin() + 1, hashes.end(), hashes.begin()));
    CHECK(comm.schedule_hash() != hash);
  }
  std::vector<float> x(4);
  CHECK_THROWS_AS(comm.all_to_all(x.data(), std::vector<size_t>(size_t(n) + 1, 0), x.data(),
                                  std::vector<size_t>(size_t(n), 0), DType::f32, Stream()),
                  ValueError);
  CHECK_THROWS_AS(comm.all_to_all(x.data(), std::vector<size_t>(size_t(n), 1), x.data(),
                                  std::vector<size_t>(size_t(n), 1), DType::f32, Stream()),
                  ValueError);  // the buffers overlap
}

TEST_CASE("grouped collectives, nested groups") {
  auto world = mpi_world();
  Communicator& comm = world->comm();
  const int n = comm.size(), me = comm.rank();
  std::vector<float> in(8 * n), gathered(8 * n * n, -1.0f), reduced(8, -1.0f), summed(8 * n, -1.0f);
  for (size_t j = 0; j < in.size(); ++j) in[j] = float(me * 100 + int(j));
  comm.group_start();
  Work a = comm.all_gather(in.data(), gathered.data(), 8 * n, DType::f32, Stream());
  comm.group_start();
  Work b = comm.reduce_scatter(in.data(), reduced.data(), 8, DType::f32, ReduceOp::Sum, Stream());
  comm.group_end();  // inner: nothing completes yet
  CHECK_FALSE(b.done());
  Work c = comm.all_reduce(in.data(), summed.data(), 8 * n, DType::f32, ReduceOp::Max, Stream());
  comm.group_end();
  CHECK((a.done() && b.done() && c.done()));
  for (int r = 0; r < n; ++r) {
    for (int j = 0; j < 8 * n; ++j) REQUIRE(gathered[r * 8 * n + j] == float(r * 100 + j));
  }
  for (int i = 0; i < 8; ++i) {
    float sum = 0;
    for (int r = 0; r < n; ++r) sum += float(r * 100 + me * 8 + i);
    REQUIRE(reduced[i] == sum);
  }
  for (int j = 0; j < 8 * n; ++j) REQUIRE(summed[j] == float((n - 1) * 100 + j));
  CHECK_THROWS_AS(comm.group_end(), ValueError);  // unmatched
}

TEST_CASE("counts() and schedule_hash()") {
  auto world = mpi_world();
  Communicator& comm = world->comm();
  const int n = comm.size();
  std::vector<double> buf(64 * n), out(64 * n);
  auto schedule = [&](Communicator& c, bool swapped) {
    if (!swapped) c.all_gather(buf.data(), out.data(), 8, DType::f32, Stream());
    c.reduce_scatter(buf.data(), out.data(), 4, DType::bf16, ReduceOp::Sum, Stream());
    if (swapped) c.all_gather(buf.data(), out.data(), 8, DType::f32, Stream());
    c.all_reduce(buf.data(), buf.data(), 10, DType::f64, ReduceOp::Avg, Stream());
    c.all_reduce(buf.data(), buf.data(), 10, DType::f64, ReduceOp::Avg, Stream());
    c.broadcast(buf.data(), 3, DType::i32, 0, Stream());
    c.barrier();
  };
  comm.reset_counts();
  const uint64_t start = comm.schedule_hash();
  schedule(comm, false);
  const Communicator::Counts& k = comm.counts();
  CHECK(k.all_gather == 1);
  CHECK(k.reduce_scatter == 1);
  CHECK(k.all_reduce == 2);
  CHECK(k.broadcast == 1);
  CHECK(k.barrier == 1);
  CHECK(k.send == 0);
  CHECK(k.recv == 0);
  CHECK(k.bytes == uint64_t(8 * 4 * n + 4 * 2 * n + 2 * 10 * 8 + 3 * 4));
  const uint64_t hash = comm.schedule_hash();
  CHECK(hash != start);
  for (uint64_t h : gather_u64(hash)) CHECK(h == hash);  // the same schedule on every rank
  comm.reset_counts();
  CHECK(comm.counts().all_reduce == 0);
  CHECK(comm.counts().bytes == 0);

  auto same = world->split("same", 0, world->rank());
  auto swapped = world->split("swapped", 0, world->rank());
  schedule(*same, false);
  schedule(*swapped, true);
  CHECK(same->schedule_hash() == hash);
  CHECK(swapped->schedule_hash() != hash);
}

TEST_CASE("tensor forms check devices, dtypes, contiguity and even sizes") {
  auto world = mpi_world();
  Communicator& comm = world->comm();
  const int n = comm.size(), me = comm.rank();
  Context ctx;
  Tensor in = ctx.empty(Shape{6}, DType::f32);
  Tensor out = ctx.empty(Shape{6 * n}, DType::f32);
  for (int i = 0; i < 6; ++i) in.data<float>()[i] = float(me * 10 + i);
  comm.all_gather(out, in, ctx.stream()).synchronize();
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < 6; ++i) REQUIRE(out.data<float>()[r * 6 + i] == float(r * 10 + i));
  }
  Tensor shard = ctx.empty(Shape{6}, DType::f32);
  comm.reduce_scatter(shard, out, ReduceOp::Sum, ctx.stream());
  // Every rank reduces the same gathered tensor: shard i is n times element me*6+i of it.
  for (int i = 0; i < 6; ++i) REQUIRE(shard.data<float>()[i] == n * float(me * 10 + i));
  comm.all_reduce(in, ReduceOp::Max, ctx.stream());
  for (int i = 0; i < 6; ++i) REQUIRE(in.data<float>()[i] == float((n - 1) * 10 + i));
  Tensor b = ctx.empty(Shape{2, 3}, DType::i64);
  for (int i = 0; i < 6; ++i) b.data<int64_t>()[i] = me == 0 ? 40 + i : -1;
  comm.broadcast(b, 0, ctx.stream());
  for (int i = 0; i < 6; ++i) REQUIRE(b.data<int64_t>()[i] == 40 + i);

  // Wrong total size; sizes that do not divide evenly ask the caller to pad.
  CHECK_THROWS_AS(comm.all_gather(ctx.empty(Shape{6 * n + n}, DType::f32), in, ctx.stream()),
                  ShapeError);
  CHECK_THROWS_AS(comm.reduce_scatter(ctx.empty(Shape{5}, DType::f32), out, ReduceOp::Sum,
                                      ctx.stream()),
                  ShapeError);
  if (n > 1) {
    try {
      comm.reduce_scatter(shard, ctx.empty(Shape{6 * n + 1}, DType::f32), ReduceOp::Sum,
                          ctx.stream());
      FAIL("uneven reduce_scatter accepted");
    } catch (const ShapeError& e) {
      CHECK_THAT(e.what(), Contains("does not divide evenly") && Contains("pad"));
    }
    try {
      comm.all_gather(ctx.empty(Shape{6 * n + 1}, DType::f32), in, ctx.stream());
      FAIL("uneven all_gather accepted");
    } catch (const ShapeError& e) {
      CHECK_THAT(e.what(), Contains("does not divide evenly") && Contains("pad"));
    }
  }
  CHECK_THROWS_AS(comm.all_gather(ctx.empty(Shape{6 * n}, DType::bf16), in, ctx.stream()),
                  DTypeError);
  Tensor matrix = ctx.empty(Shape{2, 3}, DType::f32);
  CHECK_THROWS_AS(comm.all_reduce(matrix.transpose(0, 1), ReduceOp::Sum, ctx.stream()),
                  ShapeError);
  CHECK_THROWS_AS(comm.all_reduce(Tensor(), ReduceOp::Sum, ctx.stream()), ValueError);
  // Nothing above reached MPI: the ranks are still in step.
  comm.barrier();
}

TEST_CASE("raw forms reject bad arguments before any rank communicates") {
  auto world = mpi_world();
  Communicator& comm = world->comm();
  const int n = comm.size(), me = comm.rank();
  std::vector<float> buf(16 * n + 16);
  // Overlapping buffers that are not NCCL's in-place layout.
  if (n > 1) {
    CHECK_THROWS_AS(comm.all_gather(buf.data() + 1, buf.data(), 4, DType::f32, Stream()),
                    ValueError);
  }
  CHECK_THROWS_AS(comm.all_reduce(buf.data(), buf.data() + 1, 4, DType::f32, ReduceOp::Sum,
                                  Stream()),
                  ValueError);
  CHECK_THROWS_AS(comm.all_reduce(nullptr, buf.data(), 4, DType::f32, ReduceOp::Sum, Stream()),
                  ValueError);
  CHECK_THROWS_AS(comm.all_reduce(buf.data(), buf.data(), 4, DType::f32, ReduceOp::Max, Stream(),
                                  0.5),
                  ValueError);
  CHECK_THROWS_AS(comm.all_reduce(buf.data(), buf.data(), 4, DType::i32, ReduceOp::Sum, Stream(),
                                  0.5),
                  ValueError);
  CHECK_THROWS_AS(comm.broadcast(buf.data(), 4, DType::f32, n, Stream()), IndexError);
  CHECK_THROWS_AS(comm.send(buf.data(), 4, DType::f32, -1, Stream()), IndexError);
  CHECK_THROWS_AS(comm.recv(buf.data(), 4, DType::f32, n, Stream()), IndexError);
  CHECK(comm.counts().all_reduce == 0);
  (void)me;
  comm.barrier();
}

TEST_CASE("World over MPI: numbers, summary, split") {
  auto world = mpi_world();
  const int n = testing::world_size(), me = testing::world_rank();
  CHECK(world->rank() == me);
  CHECK(world->size() == n);
  CHECK(world->device() == Device::cpu());
  CHECK(world->backend() == kBackend);
  CHECK(world->comm().name() == "world");
  CHECK(std::string(world->comm().backend()) == backend_name(kBackend));
  CHECK_THAT(world->summary(), Contains(str_cat("world: ", n, n == 1 ? " rank (" : " ranks (")) &&
                                   Contains("-> cpu") &&
                                   Contains(str_cat("backend ", backend_name(kBackend))));
  auto parity = world->split("parity", me % 2, me);
  CHECK(parity->name() == "parity");
  CHECK(parity->size() == (n + 1 - me % 2) / 2);
  CHECK(parity->rank() == me / 2);
  int64_t mine = me, sum = -1;
  parity->all_reduce(&mine, &sum, 1, DType::i64, ReduceOp::Sum, Stream());
  int64_t want = 0;
  for (int r = me % 2; r < n; r += 2) want += r;
  CHECK(sum == want);
  world->set_step(42);
  CHECK(parity->step() == 42);
  CHECK_NOTHROW(world->check_health());
}

TEST_CASE("World alone: this process as rank 0 of 1 beside the job's own world") {
  auto job = mpi_world();
  WorldOptions options;
  options.backend = kBackend;
  options.print_summary = false;
  options.alone = true;
  const int me = testing::world_rank();
  // Only odd ranks make one: collectives on it must not wait for any other process.
  if (me % 2 == 1 || testing::world_size() == 1) {
    World alone(options);
    CHECK(alone.rank() == 0);
    CHECK(alone.size() == 1);
    CHECK(alone.local_size() == 1);
    CHECK(alone.launch().local_rank == job->launch().local_rank);  // still picks its GPU
    int64_t mine = 7 + me, sum = -1;
    alone.comm().all_reduce(&mine, &sum, 1, DType::i64, ReduceOp::Sum, Stream());
    CHECK(sum == 7 + me);
  }
  // The job's world is untouched.
  int64_t one = 1, ranks = 0;
  job->comm().all_reduce(&one, &ranks, 1, DType::i64, ReduceOp::Sum, Stream());
  CHECK(ranks == testing::world_size());
}

TEST_CASE("mesh communicators: sizes, ranks and members of every group") {
  auto world = mpi_world();
  const int n = world->size(), me = world->rank();
  std::vector<MeshSizes> shapes = {{1, -1, 1, 1, 1}};
  if (n == 4) {
    shapes.push_back({1, 2, 1, 1, 2});  // FSDP x TP
    shapes.push_back({2, 2, 1, 1, 1});  // HSDP
    shapes.push_back({1, 1, 2, 1, -1});
    shapes.push_back({1, 2, 1, 2, 1});  // FSDP x EP
    shapes.push_back({2, 1, 1, 2, 1});  // HSDP x EP
  }
  if (n == 2) shapes.push_back({1, 1, 1, 2, 1});  // EP alone
  for (const MeshSizes& shape : shapes) {
    const Mesh mesh(shape, n);
    INFO(mesh.str());
    MeshCommunicators comms(*world, mesh);
    auto check = [&](Communicator& c, const std::vector<int>& members, const std::string& name) {
      INFO(name);
      CHECK(c.name() == name);
      REQUIRE(c.size() == int(members.size()));
      CHECK(members[size_t(c.rank())] == me);
      int64_t mine = me, sum = -1;
      c.all_reduce(&mine, &sum, 1, DType::i64, ReduceOp::Sum, Stream());
      int64_t want = 0;
      for (int r : members) want += r;
      CHECK(sum == want);
    };
    for (MeshAxis a : {MeshAxis::cp, MeshAxis::ep, MeshAxis::tp}) {
      check(comms.axis(a), mesh.axis_group(a, me), mesh_axis_name(a));
    }
    // FSDP's groups: the context- and expert-parallel ranks shard and reduce with the
    // data-parallel ones; the experts' groups leave the expert-parallel ranks out.
    const std::vector<int> shard = mesh.group({MeshAxis::dp_shard, MeshAxis::cp, MeshAxis::ep}, me);
    const std::vector<int> dp = mesh.group(
        {MeshAxis::dp_outer, MeshAxis::dp_shard, MeshAxis::cp, MeshAxis::ep}, me);
    if (mesh.size(MeshAxis::ep) > 1) {
      check(comms.all_gather_comm(DpGroup::expert_dp_shard),
            mesh.group({MeshAxis::dp_shard, MeshAxis::cp}, me), "expert_dp_shard/ag");
      check(comms.reduce_scatter_comm(DpGroup::expert_dp),
            mesh.group({MeshAxis::dp_outer, MeshAxis::dp_shard, MeshAxis::cp}, me), "expert_dp/rs");
    } else {
      CHECK(&comms.all_gather_comm(DpGroup::expert_dp_shard) == &comms.all_gather_comm(DpGroup::dp_shard));
      CHECK(&comms.reduce_scatter_comm(DpGroup::expert_dp) == &comms.reduce_scatter_comm(DpGroup::dp));
    }
    check(comms.all_gather_comm(DpGroup::dp_shard), shard, "dp_shard/ag");
    check(comms.reduce_scatter_comm(DpGroup::dp_shard), shard, "dp_shard/rs");
    check(comms.all_gather_comm(DpGroup::dp_outer), mesh.axis_group(MeshAxis::dp_outer, me),
          "dp_outer/ag");
    check(comms.reduce_scatter_comm(DpGroup::dp_outer), mesh.axis_group(MeshAxis::dp_outer, me),
          "dp_outer/rs");
    check(comms.all_gather_comm(DpGroup::dp), dp, "dp/ag");
    check(comms.reduce_scatter_comm(DpGroup::dp), dp, "dp/rs");
    CHECK(&comms.axis(MeshAxis::dp_shard) == &comms.all_gather_comm(DpGroup::dp_shard));
  }
  if (n > 1) CHECK_THROWS_AS(MeshCommunicators(*world, Mesh({1, 1, 1, 1, 1}, 1)), ConfigError);
}

TEST_CASE("buffer registration: a no-op on MPI; names; registrable memory on the CPU") {
  CHECK(std::string(buffer_registration_name(BufferRegistration::local)) == "local");
  CHECK(std::string(buffer_registration_name(BufferRegistration::symmetric)) == "symmetric");
  CHECK(buffer_registration_from_name("local") == BufferRegistration::local);
  CHECK(buffer_registration_from_name("symmetric") == BufferRegistration::symmetric);
  CHECK_THROWS_WITH(buffer_registration_from_name("window"), Contains("'window'"));

  // Whole 2 MiB granules, at least one.
  CHECK(registrable_bytes(0) == kRegistrableGranularity);
  CHECK(registrable_bytes(1) == kRegistrableGranularity);
  CHECK(registrable_bytes(kRegistrableGranularity) == kRegistrableGranularity);
  CHECK(registrable_bytes(kRegistrableGranularity + 1) == 2 * kRegistrableGranularity);

  auto world = mpi_world();
  Communicator& comm = world->comm();
  Context ctx;
  const size_t before = ctx.allocator()->stats().in_use;
  {
    Tensor t = zeros_registrable(ctx, 1000, DType::f32, "a test buffer");
    CHECK(t.numel() == 1000);
    CHECK(t.dtype() == DType::f32);
    CHECK(t.storage()->bytes() == kRegistrableGranularity);
    // The host allocator's accounting equals what the GPU path reports.
    CHECK(ctx.allocator()->stats().in_use - before == kRegistrableGranularity);
    for (float v : t.to_vector<float>()) REQUIRE(v == 0.0f);

    for (BufferRegistration kind : {BufferRegistration::local, BufferRegistration::symmetric}) {
      Registration r = comm.register_buffer(t, kind, "a test buffer");
      CHECK_FALSE(r.active());
      // The registered buffer still works in collectives (every rank sums its rank + 1).
      t.data<float>()[0] = float(comm.rank() + 1);
      comm.all_reduce(t.narrow(0, 0, 1), ReduceOp::Sum, Stream());
      CHECK(t.data<float>()[0] == float(comm.size() * (comm.size() + 1) / 2));
    }
    CHECK_THROWS_AS(comm.register_buffer(nullptr, 16, BufferRegistration::local, "nothing"),
                    ValueError);
    CHECK_THROWS_WITH(comm.register_buffer(t.data_ptr(), 0, BufferRegistration::local, "empty"),
                      Contains("empty"));
    CHECK_THROWS_AS(comm.register_buffer(Tensor(), BufferRegistration::local, "undefined"),
                    ValueError);
    CHECK_THROWS_AS(
        comm.register_buffer(t.view(Shape{10, 100}).transpose(0, 1), BufferRegistration::local,
                             "strided"),
        ShapeError);
  }
  // Freed with the last view.
  CHECK(ctx.allocator()->stats().in_use == before);
}

}  // namespace
}  // namespace fsdp
