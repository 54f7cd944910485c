#include "tools/bench/matmul_bench.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "runtime/core/error.h"
#include "tools/common/numeric_flags.h"

namespace fsdp::bench {
namespace {

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: bench matmul [--m M] [--n N] [--k K] [--trans-a 0|1] [--trans-b 0|1]\n"
               "                    [--f64] [--reps R] [--impl openblas|blocked|both]\n"
               "  Times out (M, N) = op(a) @ op(b) on the CPU (kernels/cpu/matmul.h), f32 unless\n"
               "  --f64, on OMP_NUM_THREADS threads: the best and the median of R runs after one\n"
               "  warm-up, in ms and GFLOP/s. The default is the CPU quickstart's output head\n"
               "  (configs/tiny.json), forward: 512 tokens x 50304 x 128, a not transposed, b\n"
               "  transposed. With both implementations the two results are compared too.\n");
}

struct Timing {
  double best_s, median_s;
};

constexpr int64_t kMaxSize = int64_t(1) << 20;  // of M, N and K

}  // namespace

int run_matmul_bench(const std::vector<std::string>& args) {
  kernels::MatmulDims d;
  d.m = 512;
  d.n = 50304;
  d.k = 128;
  d.trans_b = true;
  bool f64 = false;
  int reps = 5;
  std::string impl = "both";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      FSDP_CHECK(i + 1 < args.size(), ConfigError, a, " needs a value");
      return args[++i];
    };
    if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    } else if (a == "--m") {
      d.m = tools::integer_flag<int64_t>(a, value(), 1, kMaxSize);
    } else if (a == "--n") {
      d.n = tools::integer_flag<int64_t>(a, value(), 1, kMaxSize);
    } else if (a == "--k") {
      d.k = tools::integer_flag<int64_t>(a, value(), 1, kMaxSize);
    } else if (a == "--trans-a") {
      d.trans_a = value() == "1";
    } else if (a == "--trans-b") {
      d.trans_b = value() == "1";
    } else if (a == "--f64") {
      f64 = true;
    } else if (a == "--reps") {
      reps = tools::integer_flag<int>(a, value(), 1, 1000000);
    } else if (a == "--impl") {
      impl = value();
    } else {
      FSDP_THROW(ConfigError, "unknown argument '", a, "' (see --help)");
    }
  }
  FSDP_CHECK(d.m > 0 && d.n > 0 && d.k > 0 && reps > 0, ConfigError,
             "sizes and --reps must be positive");
  FSDP_CHECK(impl == "openblas" || impl == "blocked" || impl == "both", ConfigError,
             "--impl is openblas, blocked or both, got '", impl, "'");
  FSDP_CHECK(impl == "blocked" || kernels::cpu::matmul_uses_openblas(), ConfigError,
             "the loaded OpenBLAS is not its OpenMP build: matmul would use the blocked kernel");

  const DType dt = f64 ? DType::f64 : DType::f32;
  const size_t esize = f64 ? 8 : 4;
  // Operands are multiples of 1/8 in [-1, 1]: every product and partial sum is exact in f32
  // while K < 2^18 (|sum| * 64 < 2^24), so the two implementations must agree exactly
  // whatever their order of summation; the speed does not depend on the values.
  std::vector<char> a(size_t(d.m * d.k) * esize), b(size_t(d.k * d.n) * esize);
  auto fill = [&](std::vector<char>& v, int seed) {
    const size_t count = v.size() / esize;
    for (size_t i = 0; i < count; ++i) {
      const double x = double(int((i * 2654435761u + seed) % 17) - 8) / 8.0;
      if (f64) {
        const double y = x;
        std::memcpy(v.data() + i * 8, &y, 8);
      } else {
        const float y = float(x);
        std::memcpy(v.data() + i * 4, &y, 4);
      }
    }
  };
  fill(a, 1);
  fill(b, 2);
  std::vector<char> out_openblas(size_t(d.m * d.n) * esize), out_blocked(out_openblas.size());

  auto time = [&](bool blas, std::vector<char>& out) {
    auto call = [&] {
      if (blas)
        kernels::cpu::matmul(d, out.data(), dt, a.data(), b.data(), dt, 1.0, 0.0, nullptr,
                             nullptr, kernels::MatmulEpilogue::None);
      else
        kernels::cpu::blocked_matmul(d, out.data(), dt, a.data(), b.data(), dt, 1.0, 0.0,
                                     nullptr, nullptr, kernels::MatmulEpilogue::None);
    };
    call();  // warm-up: first-touch of the output, OpenBLAS's buffers
    std::vector<double> s;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      call();
      s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(s.begin(), s.end());
    return Timing{s.front(), s[s.size() / 2]};
  };
  const double flops = 2.0 * double(d.m) * double(d.n) * double(d.k);
  std::printf("# bench matmul: %s (%lld, %lld) = a%s @ b%s, K = %lld, %d thread(s), %d reps\n",
              f64 ? "f64" : "f32", (long long)d.m, (long long)d.n, d.trans_a ? "^T" : "",
              d.trans_b ? "^T" : "", (long long)d.k, omp_get_max_threads(), reps);
  auto report = [&](const char* name, const Timing& t) {
    std::printf("%-9s best %8.2f ms %7.1f GFLOP/s   median %8.2f ms %7.1f GFLOP/s\n", name,
                t.best_s * 1e3, flops / t.best_s * 1e-9, t.median_s * 1e3,
                flops / t.median_s * 1e-9);
  };
  if (impl != "blocked") report("openblas", time(true, out_openblas));
  if (impl != "openblas") report("blocked", time(false, out_blocked));
  if (impl == "both") {
    double worst = 0, scale = 0;
    const size_t count = out_openblas.size() / esize;
    for (size_t i = 0; i < count; ++i) {
      double x, y;
      if (f64) {
        std::memcpy(&x, out_openblas.data() + i * 8, 8);
        std::memcpy(&y, out_blocked.data() + i * 8, 8);
      } else {
        float fx, fy;
        std::memcpy(&fx, out_openblas.data() + i * 4, 4);
        std::memcpy(&fy, out_blocked.data() + i * 4, 4);
        x = fx;
        y = fy;
      }
      worst = std::max(worst, std::abs(x - y));
      scale = std::max(scale, std::abs(y));
    }
    std::printf("largest difference between the two: %.3g (largest value %.3g)\n", worst, scale);
  }
  return 0;
}

}  // namespace fsdp::bench
