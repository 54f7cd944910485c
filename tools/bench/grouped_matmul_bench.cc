#include "tools/bench/grouped_matmul_bench.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "runtime/core/context.h"
#include "runtime/core/error.h"
#include "tools/bench/device_timing.h"
#include "tools/common/numeric_flags.h"

namespace fsdp::bench {
namespace {

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: bench grouped-matmul [--experts E] [--tokens N] [--topk K] [--dim C]\n"
               "                            [--hidden F] [--reps R]\n"
               "  Times on GPU 0, bf16, the experts' first projection over R = N K rows spread\n"
               "  evenly over E experts (ops::moe_grouped_matmul: y_e = x_e w_e^T, w (E, F, C))\n"
               "  and its backward (dx and dw), as the layer runs them (auto: experts of at most\n"
               "  1536 rows in one cuBLAS grouped GEMM, the others one cuBLASLt matmul each) and\n"
               "  with one cuBLASLt matmul per expert, beside one dense matmul of the same size\n"
               "  ((R, C) by one (F, C) weight), in ms and TFLOP/s: the median of R runs after\n"
               "  two warm-ups. The default is the OLMoE-1B-7B recipe's layer: 64 experts, top-8,\n"
               "  d 2048, expert d_ff 1024, 16384 tokens (4 x 4096).\n");
}

}  // namespace

int run_grouped_matmul_bench(const std::vector<std::string>& args) {
  int64_t experts = 64, tokens = 16384, topk = 8, dim = 2048, hidden = 1024;
  int reps = 20;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> int64_t {
      FSDP_CHECK(i + 1 < args.size(), ConfigError, a, " needs a value");
      return tools::integer_flag<int64_t>(a, args[++i], 1, int64_t(1) << 30);
    };
    if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    } else if (a == "--experts") {
      experts = value();
    } else if (a == "--tokens") {
      tokens = value();
    } else if (a == "--topk") {
      topk = value();
    } else if (a == "--dim") {
      dim = value();
    } else if (a == "--hidden") {
      hidden = value();
    } else if (a == "--reps") {
      reps = int(value());
    } else {
      usage(stderr);
      FSDP_THROW(ConfigError, "bench grouped-matmul: unknown flag ", a);
    }
  }
  FSDP_CHECK(experts > 0 && tokens > 0 && topk > 0 && topk <= experts && dim > 0 && hidden > 0 &&
                 reps > 0,
             ConfigError, "bench grouped-matmul: every size must be positive and --topk at most "
             "--experts");
  FSDP_CHECK(cuda_device_count() > 0, DeviceError, "bench grouped-matmul needs a GPU");
  Context ctx(Device::cuda(0));
  const int64_t rows = tokens * topk;
  // Rows spread evenly (the first rows % experts experts get one more).
  std::vector<int64_t> counts(size_t(experts), rows / experts);
  for (int64_t e = 0; e < rows % experts; ++e) counts[size_t(e)]++;
  const Tensor x = ctx.empty(Shape{rows, dim}, DType::bf16);           // (R, C)
  const Tensor w = ctx.empty(Shape{experts, hidden, dim}, DType::bf16);  // (E, F, C)
  const Tensor y = ctx.empty(Shape{rows, hidden}, DType::bf16);        // (R, F)
  const Tensor dy = ctx.empty(Shape{rows, hidden}, DType::bf16);
  const Tensor dx = ctx.empty(Shape{rows, dim}, DType::bf16);
  const Tensor dw = ctx.empty(Shape{experts, hidden, dim}, DType::f32);  // the grad dtype
  for (const Tensor* t : {&x, &w, &dy}) ops::init_normal(ctx, *t, 1, uint64_t(t->numel()), 0, 0.0, 0.02);
  const Tensor w_dense = w.select(0, 0);  // (F, C)
  const Tensor dw_dense = dw.select(0, 0);

  const double flop = 2.0 * double(rows) * double(hidden) * double(dim);  // one product
  struct Row {
    const char* what;
    double ms, flop;
  };
  const auto grouped = ops::GroupedMatmulMethod::Auto, per_expert = ops::GroupedMatmulMethod::PerExpert;
  std::vector<Row> table = {
      {"auto forward y = x w_e^T", median_device_ms(ctx, reps, 2, [&] {
         ops::moe_grouped_matmul(ctx, y, x, w, counts, grouped);
       }), flop},
      {"per-expert forward", median_device_ms(ctx, reps, 2, [&] {
         ops::moe_grouped_matmul(ctx, y, x, w, counts, per_expert);
       }), flop},
      {"dense forward (same size)", median_device_ms(ctx, reps, 2, [&] {
         ops::matmul(ctx, y, x, w_dense, false, true);
       }), flop},
      {"auto backward dx, dw", median_device_ms(ctx, reps, 2, [&] {
         ops::moe_grouped_matmul_backward(ctx, dx, dw, dy, x, w, counts, false, grouped);
       }), 2 * flop},
      {"per-expert backward dx, dw", median_device_ms(ctx, reps, 2, [&] {
         ops::moe_grouped_matmul_backward(ctx, dx, dw, dy, x, w, counts, false, per_expert);
       }), 2 * flop},
      {"dense backward (same size)", median_device_ms(ctx, reps, 2, [&] {
         ops::matmul(ctx, dx, dy, w_dense, false, false);
         ops::matmul(ctx, dw_dense, dy, x, true, false);
       }), 2 * flop},
  };
  std::printf("grouped matmul: %lld experts, %lld tokens x top-%lld = %lld rows (%lld per expert), "
              "d %lld, expert d_ff %lld, bf16, median of %d\n",
              (long long)experts, (long long)tokens, (long long)topk, (long long)rows,
              (long long)(rows / experts), (long long)dim, (long long)hidden, reps);
  for (const Row& r : table)
    std::printf("  %-34s %9.3f ms  %7.1f TFLOP/s\n", r.what, r.ms, r.flop / (r.ms * 1e-3) / 1e12);
  return 0;
}

}  // namespace fsdp::bench
