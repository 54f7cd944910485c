#include "tools/bench/fp8_matmul_bench.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "runtime/core/context.h"
#include "runtime/core/error.h"
#include "runtime/train/recipe.h"
#include "tools/bench/device_timing.h"
#include "tools/bench/linear_shapes.h"
#include "tools/bench/workload_flags.h"

namespace fsdp::bench {
namespace {

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: bench fp8-matmul (--workload NAME | --config FILE) [--reps R] "
               "[--format e4m3|hybrid] [--scaling tensorwise|blockwise|rowwise]\n"
               "  Times on GPU 0 each linear layer of one block of the recipe's model at its\n"
               "  micro-batch, forward, dgrad and wgrad, as the layers run them: in bf16, then\n"
               "  in FP8 (the product alone, on operands quantized beforehand; then with the\n"
               "  kernels the layer runs around it: the forward quantizes x in both layouts and\n"
               "  W, dgrad the output gradient in both layouts with the bias gradient and W^T,\n"
               "  wgrad nothing more). TFLOP/s of the median of\n"
               "  R runs, and the bf16 / FP8-with-quantization time ratio. Workloads: gpt2-124m,\n"
               "  gpt-1.3b, llama-1b. --scaling blockwise: the blockwise recipe's operands (x and\n"
               "  dy in 1x128 blocks, W in 128x128 blocks, block-scaled products, no fast\n"
               "  accumulation); layers whose sizes are not multiples of 128 are skipped.\n"
               "  --scaling rowwise: the rowwise recipe's (one scale per row of each operand, its\n"
               "  amaxes in a pass of their own before the cast, row-scaled products).\n");
}

// The rowwise recipe's cast: each asked-for layout's amaxes (per row, per column), then
// both layouts from one read.
ops::Fp8Quantized quantize_rowwise(Context& ctx, const Tensor& t, ops::Fp8Format f, bool rows,
                                   bool columns, const Tensor& column_sums) {
  Tensor row_amax, column_amax;
  if (rows) {
    row_amax = ctx.empty(Shape{t.size(0)}, DType::f32);
    ops::fp8_row_amax(ctx, row_amax, t);
  }
  if (columns) {
    column_amax = ctx.empty(Shape{t.size(1)}, DType::f32);
    ops::fp8_column_amax(ctx, column_amax, t);
  }
  return ops::fp8_quantize_rowwise(ctx, t, f, row_amax, column_amax, column_sums);
}

}  // namespace

int run_fp8_matmul_bench(const std::vector<std::string>& args) {
  std::string format = "hybrid", scaling = "tensorwise";
  const WorkloadFlags flags =
      parse_workload_flags(args, usage, [&](const std::string& a, const std::function<std::string()>& value) {
        if (a == "--scaling") {
          scaling = value();
          FSDP_CHECK(scaling == "tensorwise" || scaling == "blockwise" || scaling == "rowwise",
                     ConfigError, "--scaling is tensorwise, blockwise or rowwise, not '", scaling, "'");
          return true;
        }
        if (a != "--format") return false;
        format = value();
        FSDP_CHECK(format == "e4m3" || format == "hybrid", ConfigError,
                   "--format is e4m3 or hybrid, not '", format, "'");
        return true;
      });
  const bool blockwise = scaling == "blockwise", rowwise = scaling == "rowwise";
  const bool fast_accum = !blockwise && !rowwise;  // block- and row-scaled products have none
  if (flags.help) return 0;
  const std::string& config = flags.config;
  const int reps = flags.reps;
  const train::Recipe recipe = train::load_recipe(config, {});
  Context ctx(Device::cuda(0));
  std::string why;
  FSDP_CHECK(ops::fp8_available(ctx, &why), DeviceError, "bench fp8-matmul: ", why);
  const ops::Fp8Format fwd = ops::Fp8Format::e4m3;
  const ops::Fp8Format bwd = format == "hybrid" ? ops::Fp8Format::e5m2 : ops::Fp8Format::e4m3;
  std::printf("# bench fp8-matmul: %s, %s, %s, median of %d; TFLOP/s\n", config.c_str(),
              format.c_str(), scaling.c_str(), reps);
  std::printf("%-16s %-6s %-22s %8s %8s %10s %7s\n", "layer", "pass", "(M x K) @ (K x N)", "bf16",
              "fp8", "fp8+quant", "ratio");
  double total_bf16 = 0, total_fp8 = 0;
  for (const LinearShape& l : linear_shapes_of(recipe)) {
    if (l.head) continue;  // kept in bf16
    if (blockwise && !kernels::fp8_block_shape_ok(l.rows, l.out, l.in)) {
      std::printf("%-16s skipped: (%lld x %lld x %lld) not multiples of 128\n", l.name,
                  (long long)l.rows, (long long)l.in, (long long)l.out);
      continue;
    }
    const Tensor x = ctx.empty(Shape{l.rows, l.in}, DType::bf16);   // (M, in)
    const Tensor w = ctx.empty(Shape{l.out, l.in}, DType::bf16);    // (out, in)
    const Tensor y = ctx.empty(Shape{l.rows, l.out}, DType::bf16);  // (M, out); also dy
    const Tensor dx = ctx.empty(Shape{l.rows, l.in}, DType::bf16);  // (M, in)
    const Tensor dw = ctx.empty(Shape{l.out, l.in}, DType::f32);    // (out, in)
    const Tensor b = l.bias ? ctx.empty(Shape{l.out}, DType::bf16) : Tensor();
    const Tensor db = l.bias ? ctx.empty(Shape{l.out}, DType::f32) : Tensor();
    const Tensor pre = l.gelu_after ? ctx.empty(Shape{l.rows, l.out}, DType::bf16) : Tensor();
    const Tensor pre_in = l.dgelu_input ? ctx.empty(Shape{l.rows, l.in}, DType::bf16) : Tensor();
    ops::fill(ctx, x, 0.5);
    ops::fill(ctx, w, 0.02);
    ops::fill(ctx, y, 0.01);
    if (pre_in.defined()) ops::fill(ctx, pre_in, 0.1);
    ops::fill(ctx, dw, 0.0);
    if (l.bias) ops::fill(ctx, db, 0.0);
    const ops::Epilogue fwd_ep = l.gelu_after ? ops::Epilogue::Gelu : ops::Epilogue::None;
    const ops::Epilogue dgrad_ep = l.dgelu_input ? ops::Epilogue::DGelu : ops::Epilogue::None;
    const Tensor amax = ctx.empty(Shape{1}, DType::f32);
    // Blockwise: the weight (w) in 128x128 blocks, activations and gradients in 1x128.
    auto quantize = [&](const Tensor& t, ops::Fp8Format f, bool rows, bool cols,
                        const Tensor& column_sums = Tensor()) {
      if (rowwise) return quantize_rowwise(ctx, t, f, rows, cols, column_sums);
      if (blockwise)
        return ops::fp8_quantize_blocks(ctx, t, f,
                                        t.data_ptr() == w.data_ptr() ? ops::Fp8Granularity::block_128x128
                                                                     : ops::Fp8Granularity::block_1x128,
                                        rows, cols, column_sums);
      ops::fp8_amax(ctx, amax, t);
      return ops::fp8_quantize(ctx, t, amax, f, rows, cols, column_sums);
    };
    const ops::Fp8Quantized qx = quantize(x, fwd, true, true), qw = quantize(w, fwd, true, true);
    const ops::Fp8Quantized qdy = quantize(y, bwd, true, true);
    struct Pass {
      const char* name;
      int64_t m, k, n;
      std::function<void()> bf16, fp8, fp8_with_quantization;
    };
    const std::vector<Pass> passes = {
        {"fwd", l.rows, l.in, l.out,
         [&] { ops::matmul(ctx, y, x, w, false, true, 1.0, 0.0, b, fwd_ep, pre); },
         [&] { ops::fp8_matmul(ctx, y, qx.rows, qw.rows, 1.0, 0.0, b, fwd_ep, pre, fast_accum); },
         [&] {
           // Both layouts of x in one pass: the layer keeps the columns for wgrad.
           const auto a = quantize(x, fwd, true, true), c = quantize(w, fwd, true, false);
           ops::fp8_matmul(ctx, y, a.rows, c.rows, 1.0, 0.0, b, fwd_ep, pre, fast_accum);
         }},
        {"dgrad", l.rows, l.out, l.in,
         [&] { ops::matmul(ctx, dx, y, w, false, false, 1.0, 0.0, Tensor(), dgrad_ep, pre_in); },
         [&] { ops::fp8_matmul(ctx, dx, qdy.rows, qw.columns, 1.0, 0.0, Tensor(), dgrad_ep, pre_in); },
         [&] {
           // The output gradient's two layouts (and the bias gradient from the same read)
           // are made once, counted here.
           const auto g = quantize(y, bwd, true, true, db), c = quantize(w, fwd, false, true);
           ops::fp8_matmul(ctx, dx, g.rows, c.columns, 1.0, 0.0, Tensor(), dgrad_ep, pre_in);
         }},
        {"wgrad", l.out, l.rows, l.in,
         [&] {
           if (l.bias)
             ops::matmul_bias_grad(ctx, dw, y, x, true, false, 1.0, 1.0, db, true);
           else
             ops::matmul(ctx, dw, y, x, true, false, 1.0, 1.0);
         },
         [&] { ops::fp8_matmul(ctx, dw, qdy.columns, qx.columns, 1.0, 1.0); },
         [&] {
           // x's columns come from the forward, the bias gradient from dy's quantization.
           ops::fp8_matmul(ctx, dw, qdy.columns, qx.columns, 1.0, 1.0);
         }},
    };
    for (const Pass& p : passes) {
      const double t_bf16 = median_device_ms(ctx, reps, 2, p.bf16);
      const double t_fp8 = median_device_ms(ctx, reps, 2, p.fp8);
      const double t_all = median_device_ms(ctx, reps, 2, p.fp8_with_quantization);
      const double flop = 2.0 * double(p.m) * double(p.k) * double(p.n);
      std::printf("%-16s %-6s %-22s %8.1f %8.1f %10.1f %7.3f\n", l.name, p.name,
                  str_cat("(", p.m, " x ", p.k, ") @ (", p.k, " x ", p.n, ")").c_str(),
                  flop / t_bf16 / 1e9, flop / t_fp8 / 1e9, flop / t_all / 1e9, t_bf16 / t_all);
      total_bf16 += t_bf16;
      total_fp8 += t_all;
    }
  }
  std::printf("one block: bf16 %.3f ms, fp8 with quantization %.3f ms (%.3fx)\n", total_bf16,
              total_fp8, total_bf16 / total_fp8);
  // The quantization kernels alone on the largest activation (M x the widest layer), in
  // GB/s of the bytes each must move (amax: reads bf16; quantize: reads bf16, writes both
  // FP8 layouts), against the ~4.2 TB/s copy ceiling.
  int64_t rows = 0, cols = 0;
  for (const LinearShape& l : linear_shapes_of(recipe))
    if (!l.head && l.rows * std::max(l.in, l.out) > rows * cols) {
      rows = l.rows;
      cols = std::max(l.in, l.out);
    }
  const Tensor t = ctx.empty(Shape{rows, cols}, DType::bf16), amax = ctx.empty(Shape{1}, DType::f32);
  ops::fill(ctx, t, 0.25);
  const double bytes = double(rows) * double(cols);
  const double t_amax = median_device_ms(ctx, reps, 2, [&] { ops::fp8_amax(ctx, amax, t); });
  auto quantize_alone = [&](bool columns) {
    if (rowwise)
      quantize_rowwise(ctx, t, bwd, true, columns, Tensor());
    else if (blockwise)
      ops::fp8_quantize_blocks(ctx, t, bwd, ops::Fp8Granularity::block_1x128, true, columns);
    else
      ops::fp8_quantize(ctx, t, amax, bwd, true, columns);
  };
  const double t_both = median_device_ms(ctx, reps, 2, [&] { quantize_alone(true); });
  const double t_rows = median_device_ms(ctx, reps, 2, [&] { quantize_alone(false); });
  std::printf("quantize (%lld x %lld) bf16: amax %.3f ms (%.0f GB/s), rows+columns %.3f ms "
              "(%.0f GB/s), rows %.3f ms (%.0f GB/s)\n", (long long)rows, (long long)cols, t_amax,
              2 * bytes / t_amax / 1e6, t_both, 4 * bytes / t_both / 1e6, t_rows, 3 * bytes / t_rows / 1e6);
  if (rowwise)
    std::printf("  (rowwise: each cast's time includes its amax passes, one read per layout, which "
                "the GB/s above do not count as bytes)\n");
  return 0;
}

}  // namespace fsdp::bench
