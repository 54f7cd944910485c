#include "tools/bench/collectives_bench.h"

#include <mpi.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <functional>
#include <sstream>

#include "collectives/check.h"
#include "collectives/comm_memory.h"
#include "collectives/mpi_communicator.h"
#include "runtime/core/context.h"
#include "runtime/core/error.h"
#include "tools/common/numeric_flags.h"

#if FSDP_WITH_CUDA
#include "tools/bench/nccl_baseline.h"
#endif

namespace fsdp::bench {
namespace {

CollectiveKind parse_op(const std::string& name) {
  if (name == "all_gather" || name == "ag") return CollectiveKind::all_gather;
  if (name == "reduce_scatter" || name == "rs") return CollectiveKind::reduce_scatter;
  if (name == "all_reduce" || name == "ar") return CollectiveKind::all_reduce;
  FSDP_THROW(ConfigError, "--ops: unknown operation '", name,
             "' (all_gather|ag, reduce_scatter|rs, all_reduce|ar)");
}

int parse_count(const std::string& flag, const std::string& text, int lo = 1) {
  return tools::integer_flag<int>(flag, text, lo, 1000000);
}

std::string human_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  char text[32];
  std::snprintf(text, sizeof text, v == double(int64_t(v)) ? "%.0f %s" : "%.2f %s", v, units[u]);
  return text;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The bus-bandwidth factor of nccl-tests for an operation over n ranks.
double bus_factor(CollectiveKind op, int n) {
  if (n == 1) return 1.0;
  return op == CollectiveKind::all_reduce ? 2.0 * (n - 1) / n : double(n - 1) / n;
}

// Element i of rank r's input for --check: small whole numbers, exact in every dtype.
double pattern(int rank, size_t i) { return double((size_t(rank) * 3 + i) % 8); }

// One benchmark: the buffers, communicator and stream every measurement shares.
class Runner {
 public:
  Runner(World& world, const CollectivesBenchOptions& opt, size_t max_bytes)
      : world_(world), opt_(opt), ctx_(world.device()), comm_(world.comm()) {
    if (!opt.registration) {
      // Never initialized: the values do not change the speed of the collectives.
      send_ = ctx_.empty(Shape{int64_t(max_bytes)}, DType::u8);
      recv_ = ctx_.empty(Shape{int64_t(max_bytes)}, DType::u8);
      return;
    }
    // Memory NCCL can register (ncclMemAlloc), registered whole, in the same order on every
    // rank (symmetric registration is collective).
    send_ = zeros_registrable(ctx_, int64_t(max_bytes), DType::u8, "the send buffer");
    recv_ = zeros_registrable(ctx_, int64_t(max_bytes), DType::u8, "the receive buffer");
    for (const Tensor* t : {&send_, &recv_}) {
      registrations_.push_back(comm_.register_buffer(
          t->storage()->data(), t->storage()->bytes(), *opt.registration,
          t == &send_ ? "the send buffer" : "the receive buffer"));
    }
  }
  ~Runner() {
    // Deregister only once no queued collective uses the buffers.
    if (!registrations_.empty() && !world_.health()->failed()) {
      try {
        ctx_.stream().synchronize();
      } catch (const std::exception&) {
      }
    }
    registrations_.clear();
  }
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  // Elements per rank (all-gather, reduce-scatter) or in all (all-reduce) for `size` bytes.
  size_t count_for(CollectiveKind op, size_t size) const {
    const size_t es = dtype_size(opt_.dtype);
    return op == CollectiveKind::all_reduce ? size / es : size / (es * size_t(comm_.size()));
  }
  size_t bytes_for(CollectiveKind op, size_t count) const {
    const size_t es = dtype_size(opt_.dtype);
    return op == CollectiveKind::all_reduce ? count * es : count * es * size_t(comm_.size());
  }

  void ours(CollectiveKind op, size_t count) {
    const Stream& s = ctx_.stream();
    void* in = send_.data_ptr();
    void* out = recv_.data_ptr();
    switch (op) {
      case CollectiveKind::all_gather: comm_.all_gather(in, out, count, opt_.dtype, s); break;
      case CollectiveKind::reduce_scatter:
        comm_.reduce_scatter(in, out, count, opt_.dtype, ReduceOp::Sum, s);
        break;
      default: comm_.all_reduce(in, out, count, opt_.dtype, ReduceOp::Sum, s); break;
    }
  }

  // The backend's own call; false where it has none for this dtype (MPI: no bf16/f16).
  bool raw_available(CollectiveKind op) const {
    if (world_.backend() == Backend::Nccl) return true;
    return op == CollectiveKind::all_gather || mpi_type(opt_.dtype) != MPI_DATATYPE_NULL;
  }

  void raw(CollectiveKind op, size_t count) {
    const size_t es = dtype_size(opt_.dtype);
    void* in = send_.data_ptr();
    void* out = recv_.data_ptr();
#if FSDP_WITH_CUDA
    if (world_.backend() == Backend::Nccl) {
      ncclComm_t comm = static_cast<NcclCommunicator&>(comm_).nccl_comm();
      CUstream_st* s = ctx_.stream().cuda_stream();
      switch (op) {
        case CollectiveKind::all_gather: raw_nccl_all_gather(comm, in, out, count, opt_.dtype, s); break;
        case CollectiveKind::reduce_scatter:
          raw_nccl_reduce_scatter(comm, in, out, count, opt_.dtype, s);
          break;
        default: raw_nccl_all_reduce(comm, in, out, count, opt_.dtype, s); break;
      }
      return;
    }
#endif
    MPI_Comm comm = static_cast<MpiCommunicator&>(comm_).mpi_comm();
    switch (op) {
      case CollectiveKind::all_gather:
        FSDP_CALL(MPI_Allgather(in, int(count * es), MPI_BYTE, out, int(count * es), MPI_BYTE, comm));
        break;
      case CollectiveKind::reduce_scatter:
        FSDP_CALL(MPI_Reduce_scatter_block(in, out, int(count), mpi_type(opt_.dtype), MPI_SUM, comm));
        break;
      default:
        FSDP_CALL(MPI_Allreduce(in, out, int(count), mpi_type(opt_.dtype), MPI_SUM, comm));
        break;
    }
  }

  // Microseconds per operation: `iters` back-to-back issues after `warmup` untimed ones.
  double time_us(const std::function<void()>& issue, int warmup, int iters) {
    for (int i = 0; i < warmup; ++i) issue();
    if (world_.backend() == Backend::Nccl) {
      ctx_.stream().synchronize();
      Event start = Event::create(world_.device(), true);
      Event end = Event::create(world_.device(), true);
      start.record(ctx_.stream());
      for (int i = 0; i < iters; ++i) issue();
      end.record(ctx_.stream());
      end.synchronize();
      world_.check_health();
      return double(Event::elapsed_ms(start, end)) * 1000.0 / iters;
    }
    comm_.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) issue();
    comm_.barrier();
    const std::chrono::duration<double, std::micro> spent = std::chrono::steady_clock::now() - t0;
    return spent.count() / iters;
  }

  // Runs our operation once on known inputs and compares every element of the result.
  void check(CollectiveKind op, size_t count) {
    const int n = comm_.size(), me = comm_.rank();
    const size_t es = dtype_size(opt_.dtype);
    const size_t in_count = op == CollectiveKind::reduce_scatter ? count * n : count;
    const size_t out_count = op == CollectiveKind::all_gather ? count * n : count;
    std::vector<unsigned char> host_in(in_count * es), host_out(out_count * es);
    dispatch_dtype(opt_.dtype, [&](auto tag) {
      using T = decltype(tag);
      T* p = reinterpret_cast<T*>(host_in.data());
      for (size_t i = 0; i < in_count; ++i) p[i] = from_double<T>(pattern(me, i));
    });
    copy_bytes(send_.narrow(0, 0, int64_t(host_in.size())), host_tensor(host_in), ctx_.stream());
    ours(op, count);
    ctx_.stream().synchronize();
    copy_bytes(host_tensor(host_out), recv_.narrow(0, 0, int64_t(host_out.size())), ctx_.stream());
    ctx_.stream().synchronize();
    dispatch_dtype(opt_.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* got = reinterpret_cast<const T*>(host_out.data());
      for (size_t i = 0; i < out_count; ++i) {
        double want = 0;
        if (op == CollectiveKind::all_gather) {
          want = pattern(int(i / count), i % count);
        } else {
          const size_t j = op == CollectiveKind::reduce_scatter ? size_t(me) * count + i : i;
          for (int r = 0; r < n; ++r) want += pattern(r, j);
        }
        FSDP_CHECK(to_double(got[i]) == to_double(from_double<T>(want)), InternalError,
                   "bench collectives --check: ", collective_name(op), " of ", count, " x ",
                   dtype_name(opt_.dtype), " on rank ", me, " gave ", to_double(got[i]),
                   " at element ", i, ", expected ", want);
      }
    });
  }

 private:
  static MPI_Datatype mpi_type(DType dtype) {
    switch (dtype) {
      case DType::f32: return MPI_FLOAT;
      case DType::f64: return MPI_DOUBLE;
      case DType::i32: return MPI_INT32_T;
      case DType::i64: return MPI_INT64_T;
      case DType::u8: return MPI_UINT8_T;
      case DType::u16: return MPI_UINT16_T;
      default: return MPI_DATATYPE_NULL;
    }
  }

  static Tensor host_tensor(std::vector<unsigned char>& bytes) {
    return Tensor::from_storage(Storage::wrap(bytes.data(), bytes.size(), Device::cpu()),
                                Shape{int64_t(bytes.size())}, DType::u8);
  }

  World& world_;
  const CollectivesBenchOptions& opt_;
  Context ctx_;
  Communicator& comm_;
  Tensor send_, recv_;
  std::vector<Registration> registrations_;  // --register: of send_ and recv_
};

}  // namespace

const char* collectives_bench_usage() {
  return "usage: bench collectives [--ops ag,rs,ar] [--min-bytes 1M] [--max-bytes 1G]\n"
         "                         [--step-factor 2|4] [--dtype bf16] [--iters N] [--warmup N]\n"
         "                         [--rounds N] [--backend auto|nccl|mpi] [--timeout-s S] [--check]\n"
         "                         [--register none|local|symmetric]\n";
}

size_t parse_byte_size(const std::string& flag, const std::string& text) {
  // Digits, then an optional unit; at most 1024G in all.
  uint64_t v = 0;
  const auto [stop, error] = std::from_chars(text.data(), text.data() + text.size(), v);
  FSDP_CHECK(error == std::errc() && v > 0, ConfigError, flag, " ", text,
             ": expected a size such as 4096, 64K, 1M or 1G");
  const size_t used = size_t(stop - text.data());
  std::string unit = text.substr(used);
  if (unit.size() > 1 && (unit.substr(1) == "iB" || unit.substr(1) == "B")) unit = unit.substr(0, 1);
  size_t scale = 1;
  if (unit == "K" || unit == "k") scale = size_t(1) << 10;
  else if (unit == "M" || unit == "m") scale = size_t(1) << 20;
  else if (unit == "G" || unit == "g") scale = size_t(1) << 30;
  else FSDP_CHECK(unit.empty() || unit == "B", ConfigError, flag, " ", text, ": unknown unit '", unit, "'");
  FSDP_CHECK(v <= (uint64_t(1) << 40) / scale, ConfigError, flag, " ", text, ": more than 1024G");
  return size_t(v) * scale;
}

CollectivesBenchOptions parse_collectives_bench_args(const std::vector<std::string>& args) {
  CollectivesBenchOptions opt;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (flag == "--help" || flag == "-h") {
      opt.help = true;
      continue;
    }
    if (flag == "--check") {
      opt.check = true;
      continue;
    }
    FSDP_CHECK(i + 1 < args.size(), ConfigError, "bench collectives: ", flag, " needs a value");
    const std::string& value = args[++i];
    if (flag == "--ops") {
      opt.ops.clear();
      std::stringstream list(value);
      std::string name;
      while (std::getline(list, name, ',')) opt.ops.push_back(parse_op(name));
      FSDP_CHECK(!opt.ops.empty(), ConfigError, "--ops: empty list");
    } else if (flag == "--min-bytes") {
      opt.min_bytes = parse_byte_size(flag, value);
    } else if (flag == "--max-bytes") {
      opt.max_bytes = parse_byte_size(flag, value);
    } else if (flag == "--step-factor") {
      opt.step_factor = parse_count(flag, value, 2);
    } else if (flag == "--dtype") {
      try {
        opt.dtype = dtype_from_name(value);
      } catch (const DTypeError& e) {
        FSDP_THROW(ConfigError, "--dtype ", value, ": ", e.what());
      }
    } else if (flag == "--iters") {
      opt.iters = parse_count(flag, value);
    } else if (flag == "--warmup") {
      opt.warmup = parse_count(flag, value, 0);
    } else if (flag == "--rounds") {
      opt.rounds = parse_count(flag, value);
    } else if (flag == "--timeout-s") {
      opt.timeout_s = parse_count(flag, value);
    } else if (flag == "--register") {
      if (value == "none") {
        opt.registration.reset();
      } else {
        try {
          opt.registration = buffer_registration_from_name(value);
        } catch (const ConfigError&) {
          FSDP_THROW(ConfigError, "--register ", value, ": expected none, local or symmetric");
        }
      }
    } else if (flag == "--backend") {
      if (value == "auto") opt.backend = Backend::Auto;
      else if (value == "nccl") opt.backend = Backend::Nccl;
      else if (value == "mpi") opt.backend = Backend::Mpi;
      else FSDP_THROW(ConfigError, "--backend ", value, ": expected auto, nccl or mpi");
    } else {
      FSDP_THROW(ConfigError, "bench collectives: unknown flag ", flag, "\n", collectives_bench_usage());
    }
  }
  return opt;
}

int run_collectives_bench(const std::vector<std::string>& args) {
  CollectivesBenchOptions opt = parse_collectives_bench_args(args);
  if (opt.help) {
    std::fputs(collectives_bench_usage(), stdout);
    return 0;
  }
  WorldOptions world_options;
  world_options.backend = opt.backend;
  world_options.timeout = std::chrono::milliseconds(int64_t(opt.timeout_s * 1000));
  World world(world_options);
  const bool gpu = world.backend() == Backend::Nccl;
  if (opt.min_bytes == 0) opt.min_bytes = gpu ? size_t(1) << 20 : size_t(4) << 10;
  if (opt.max_bytes == 0) opt.max_bytes = std::max(opt.min_bytes, gpu ? size_t(1) << 30 : size_t(256) << 10);
  if (opt.iters == 0) opt.iters = gpu ? 20 : 5;
  if (opt.warmup < 0) opt.warmup = gpu ? 5 : 1;
  if (opt.rounds == 0) opt.rounds = gpu ? 3 : 1;
  FSDP_CHECK(opt.min_bytes <= opt.max_bytes, ConfigError, "--min-bytes ", opt.min_bytes,
             " is larger than --max-bytes ", opt.max_bytes);

  Runner runner(world, opt, opt.max_bytes);
  const int n = world.size();
  const bool print = world.rank() == 0;
  if (print) {
    std::printf("# bench collectives: %d ranks, backend %s, dtype %s, %d iterations after %d "
                "warm-up, median of %d rounds%s, buffers %s\n",
                n, backend_name(world.backend()), dtype_name(opt.dtype), opt.iters, opt.warmup,
                opt.rounds, opt.check ? ", results checked" : "",
                !opt.registration ? "unregistered"
                : gpu             ? (*opt.registration == BufferRegistration::local
                                         ? "registered (local)"
                                         : "registered (symmetric window)")
                                  : "unregistered (registration is a no-op on MPI)");
    std::printf("#%41s %-30s %-30s\n", "", "------------ ours ------------",
                "------------ raw -------------");
    std::printf("# %-14s %10s %12s %10s %9s %9s %10s %9s %9s %9s\n", "op", "size", "count",
                "time(us)", "algbw", "busbw", "time(us)", "algbw", "busbw", "ours/raw");
  }
  double worst_ratio = 0;
  std::string worst_at;
  for (CollectiveKind op : opt.ops) {
    bool first = true;
    for (size_t size = opt.min_bytes; size <= opt.max_bytes; size *= size_t(opt.step_factor)) {
      const size_t count = runner.count_for(op, size);
      if (count == 0) continue;
      const size_t bytes = runner.bytes_for(op, count);
      if (opt.check) runner.check(op, count);
      const int warmup = first ? opt.warmup : std::min(opt.warmup, 2);
      first = false;
      std::vector<double> ours_us, raw_us;
      const bool has_raw = runner.raw_available(op);
      for (int r = 0; r < opt.rounds; ++r) {
        ours_us.push_back(runner.time_us([&] { runner.ours(op, count); }, r == 0 ? warmup : 0, opt.iters));
        if (has_raw) {
          raw_us.push_back(runner.time_us([&] { runner.raw(op, count); }, r == 0 ? warmup : 0, opt.iters));
        }
      }
      const double t_ours = median(ours_us);
      const double alg_ours = double(bytes) / t_ours / 1e3;  // bytes/us = MB/s; /1e3 = GB/s
      const double factor = bus_factor(op, n);
      if (!print) continue;
      std::printf("  %-14s %10s %12zu %10.1f %9.2f %9.2f", collective_name(op),
                  human_bytes(bytes).c_str(), count,
                  t_ours, alg_ours, alg_ours * factor);
      if (has_raw) {
        const double t_raw = median(raw_us);
        const double alg_raw = double(bytes) / t_raw / 1e3;
        const double ratio = 100.0 * t_raw / t_ours;
        std::printf(" %10.1f %9.2f %9.2f %8.1f%%\n", t_raw, alg_raw, alg_raw * factor, ratio);
        if (worst_at.empty() || ratio < worst_ratio) {
          worst_ratio = ratio;
          worst_at = str_cat(collective_name(op), " at ", human_bytes(bytes));
        }
      } else {
        std::printf(" %10s %9s %9s %9s\n", "n/a", "n/a", "n/a", "n/a");
      }
    }
  }
  if (print && !worst_at.empty()) {
    std::printf("# lowest ours/raw: %.1f%% (%s)\n", worst_ratio, worst_at.c_str());
  }
  std::fflush(stdout);
  world.comm().barrier();
  return 0;
}

}  // namespace fsdp::bench
