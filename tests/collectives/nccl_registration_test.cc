// NCCL user-buffer registration on GPUs, under mpirun -np 2 on the GPU machine (skipped
// without a GPU): all-gathers (out of place and in place) and reduce-scatters (sum, avg, a
// pre-multiplied sum) on buffers from ncclMemAlloc registered locally (ncclCommRegister) and
// as symmetric windows (ncclCommWindowRegister), at an offset inside the registration,
// must give bitwise the results of the same calls on caching-allocator memory, and those
// results must be the exact ones.
//
// Inputs are bf16/f32 values of magnitude in [1/8, 2) with 8 significant bits, so that the
// sum of two of them is exact in f32 and any order or accumulator gives one rounding: equal
// results are then required of every kernel NCCL may pick at two ranks (ring, symmetric LL
// or store/load kernels). Sizes cover the small-message kernels and the bandwidth ones.
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collectives/comm_memory.h"
#include "collectives/world.h"
#include "runtime/core/context.h"
#include "tests/collectives/collective_checks.h"
#include "tests/test_support.h"

namespace fsdp {
namespace {

using testing::first_mismatch;
using testing::HostBuffer;

std::unique_ptr<World> nccl_world() {
  WorldOptions options;
  options.backend = backend_from_name(testing::gpu_backend_name(), "FSDP_TEST_GPU_BACKEND");
  options.print_summary = testing::world_rank() == 0;
  options.timeout = std::chrono::seconds(120);
  return std::make_unique<World>(options);
}

Tensor host_view(HostBuffer& b) {
  return Tensor::from_storage(Storage::wrap(b.data(), b.nbytes(), Device::cpu()),
                              Shape{int64_t(b.size())}, b.dtype());
}

HostBuffer download(Context& ctx, const Tensor& dev) {
  HostBuffer host(dev.dtype(), size_t(dev.numel()));
  ctx.stream().synchronize();
  copy_bytes(host_view(host), dev, ctx.stream());
  ctx.stream().synchronize();
  return host;
}

// Element i of `rank`'s input: +-(1 + k/128) * 2^-e with e in 0..3 (8 significant bits).
double value(int rank, size_t i) {
  uint64_t h = (uint64_t(rank) + 1) * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull;
  h ^= h >> 29;
  const double mantissa = 1.0 + double(h % 128) / 128.0;
  const int e = int((h >> 8) % 4);
  return ((h >> 12) & 1 ? -1.0 : 1.0) * mantissa / double(1 << e);
}

// `v` rounded to `dt` (the values above are exact in bf16 and f32; this keeps the
// expectation honest if they were not).
double quantize(DType dt, double v) {
  HostBuffer b(dt, 1);
  b.set(0, v);
  return b.get(0);
}

// The operation under test, on `send` / `recv` (views at the same offsets on every rank).
enum class Op { all_gather, all_gather_in_place, rs_sum, rs_avg, rs_prescaled };

const char* op_name(Op op) {
  switch (op) {
    case Op::all_gather: return "all_gather";
    case Op::all_gather_in_place: return "all_gather in place";
    case Op::rs_sum: return "reduce_scatter sum";
    case Op::rs_avg: return "reduce_scatter avg";
    case Op::rs_prescaled: return "reduce_scatter sum, prescale 0.5";
  }
  return "?";
}

// Runs `op` over `count` elements per rank with inputs taken from `in` (n * count elements
// for reduce-scatters and in-place all-gathers: the whole buffer; count otherwise), on device
// buffers `send` and `recv` (at least n * count elements each), and returns the result as
// the host sees it: the gathered buffer, or this rank's reduced shard.
HostBuffer run(Context& ctx, Communicator& comm, Op op, HostBuffer& in, const Tensor& send,
               const Tensor& recv, size_t count) {
  const int n = comm.size(), me = comm.rank();
  const DType dt = in.dtype();
  const Stream& s = ctx.stream();
  const size_t chunk = count * dtype_size(dt);
  // Poisoned outputs: a collective that writes nothing is caught.
  HostBuffer poison(dt, count * n);
  poison.poison();
  copy_bytes(recv.narrow(0, 0, int64_t(count) * n), host_view(poison), s);
  switch (op) {
    case Op::all_gather:
      copy_bytes(send.narrow(0, 0, int64_t(count)), host_view(in), s);
      comm.all_gather(send.data_ptr(), recv.data_ptr(), count, dt, s);
      return download(ctx, recv.narrow(0, 0, int64_t(count) * n));
    case Op::all_gather_in_place: {
      copy_bytes(recv.narrow(0, 0, int64_t(count) * n), host_view(in), s);
      const void* mine = static_cast<const char*>(recv.data_ptr()) + size_t(me) * chunk;
      comm.all_gather(mine, recv.data_ptr(), count, dt, s);
      return download(ctx, recv.narrow(0, 0, int64_t(count) * n));
    }
    default: {
      copy_bytes(send.narrow(0, 0, int64_t(count) * n), host_view(in), s);
      const ReduceOp rop = op == Op::rs_avg ? ReduceOp::Avg : ReduceOp::Sum;
      const double prescale = op == Op::rs_prescaled ? 0.5 : 1.0;
      comm.reduce_scatter(send.data_ptr(), recv.data_ptr(), count, dt, rop, s, prescale);
      return download(ctx, recv.narrow(0, 0, int64_t(count)));
    }
  }
}

// What `op` must give on this rank (exact: see the file comment).
HostBuffer expected(Op op, DType dt, int n, int me, size_t count) {
  const bool gather = op == Op::all_gather || op == Op::all_gather_in_place;
  HostBuffer want(dt, gather ? count * n : count);
  for (size_t j = 0; j < want.size(); ++j) {
    if (gather) {
      want.set(j, quantize(dt, value(int(j / count), j % count)));
      continue;
    }
    double sum = 0;
    for (int r = 0; r < n; ++r) sum += quantize(dt, value(r, size_t(me) * count + j));
    want.set(j, op == Op::rs_sum ? sum : op == Op::rs_avg ? sum / n : sum * 0.5);
  }
  return want;
}

// Rank `me`'s input for `op`.
HostBuffer input(Op op, DType dt, int n, int me, size_t count) {
  const bool whole = op != Op::all_gather;
  HostBuffer in(dt, whole ? count * n : count);
  for (size_t j = 0; j < in.size(); ++j) {
    // In place, this rank's chunk of the gathered buffer is its input; the rest is garbage
    // the gather overwrites.
    const bool mine = op != Op::all_gather_in_place || j / count == size_t(me);
    const size_t i = op == Op::all_gather_in_place ? j % count : j;
    in.set(j, mine ? value(me, i) : -1234.0);
  }
  return in;
}

TEST_CASE("NCCL: collectives on registered buffers equal the unregistered ones bitwise",
          "[gpu]") {
  FSDP_REQUIRE_GPU();
  auto world = nccl_world();
  Communicator& comm = world->comm();
  Context ctx(world->device());
  const int n = comm.size(), me = comm.rank();
  // Registered views start this far into their registration, the same on every rank (a
  // symmetric collective needs equal offsets), on a 4096-byte boundary.
  const int64_t offset_bytes = 8192;
  const size_t max_count = (size_t(4) << 20) + 4096;  // elements per rank
  for (BufferRegistration kind : {BufferRegistration::local, BufferRegistration::symmetric}) {
    for (DType dt : {DType::bf16, DType::f32}) {
      const int64_t elems = int64_t(max_count) * n + offset_bytes / int64_t(dtype_size(dt));
      Tensor plain_send = ctx.empty(Shape{elems}, dt), plain_recv = ctx.empty(Shape{elems}, dt);
      Tensor reg_send = zeros_registrable(ctx, elems, dt, "the test's send buffer");
      Tensor reg_recv = zeros_registrable(ctx, elems, dt, "the test's receive buffer");
      std::vector<Registration> regs;
      for (const Tensor* t : {&reg_send, &reg_recv}) {
        regs.push_back(comm.register_buffer(t->storage()->data(), t->storage()->bytes(), kind,
                                            t == &reg_send ? "send" : "receive"));
        // The staged backend registers nothing: its collectives only copy the buffers.
        if (world->backend() == Backend::Nccl) {
          REQUIRE(regs.back().active());
          CHECK(regs.back().kind() == kind);
        } else {
          CHECK(!regs.back().active());
        }
      }
      const int64_t off = offset_bytes / int64_t(dtype_size(dt));
      const Tensor send = reg_send.narrow(0, off, elems - off);
      const Tensor recv = reg_recv.narrow(0, off, elems - off);
      for (size_t count : {size_t(1000), size_t(1) << 16, size_t(1) << 20, max_count}) {
        for (Op op : {Op::all_gather, Op::all_gather_in_place, Op::rs_sum, Op::rs_avg,
                      Op::rs_prescaled}) {
          INFO(buffer_registration_name(kind) << " " << dtype_name(dt) << " " << op_name(op)
                                              << " count " << count << " rank " << me);
          HostBuffer in = input(op, dt, n, me, count);
          const HostBuffer want = expected(op, dt, n, me, count);
          const HostBuffer plain = run(ctx, comm, op, in, plain_send, plain_recv, count);
          REQUIRE(first_mismatch(plain, want) == "");
          const HostBuffer registered = run(ctx, comm, op, in, send, recv, count);
          REQUIRE(first_mismatch(registered, plain) == "");
        }
      }
      // Deregistered (by the handles) once the device is done with the buffers, then freed.
      ctx.stream().synchronize();
      regs.clear();
    }
  }
  world->check_health();
}

}  // namespace
}  // namespace fsdp
