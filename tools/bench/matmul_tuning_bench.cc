#include "tools/bench/matmul_tuning_bench.h"

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

#if FSDP_WITH_CUDA
#include "kernels/cuda/matmul.h"
#endif

namespace fsdp::bench {
namespace {

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: bench matmul-tuning (--workload NAME | --config FILE) [--reps R]\n"
               "  Times on GPU 0, bf16, every distinct matmul of one transformer block and the\n"
               "  output head of the recipe's model at its micro-batch (rows = micro_batch_size x\n"
               "  seq_length; the head's rows are one classifier chunk), as the layers run them:\n"
               "  forward with its epilogue (bias, GELU), dgrad (the GELU gradient fused where\n"
               "  the model fuses it), wgrad accumulating into f32 with the bias gradient. Each\n"
               "  runs with cuBLASLt's heuristic choice, then with the timed choice\n"
               "  (train.matmul_tuning): the median of R runs, in TFLOP/s. Workloads: gpt2-124m,\n"
               "  gpt-1.3b, llama-1b.\n");
}

}  // namespace

int run_matmul_tuning_bench(const std::vector<std::string>& args) {
  const WorkloadFlags flags = parse_workload_flags(args, usage);
  if (flags.help) return 0;
  const std::string& config = flags.config;
  const int reps = flags.reps;
#if FSDP_WITH_CUDA
  const train::Recipe recipe = train::load_recipe(config, {});
  Context ctx(Device::cuda(0));
  kernels::cuda::Blas& blas = ctx.extension<kernels::cuda::Blas>();
  std::printf("# bench matmul-tuning: %s, bf16 operands, f32 weight gradients, median of %d\n",
              config.c_str(), reps);
  std::printf("%-16s %-6s %-22s %10s %10s %7s\n", "layer", "pass", "(M x K) @ (K x N)",
              "heuristic", "tuned", "ratio");
  double total_heuristic = 0, total_tuned = 0;
  for (const LinearShape& l : linear_shapes_of(recipe)) {
    const Tensor x = ctx.empty(Shape{l.rows, l.in}, DType::bf16);      // (M, in)
    const Tensor w = ctx.empty(Shape{l.out, l.in}, DType::bf16);       // (out, in)
    const Tensor y = ctx.empty(Shape{l.rows, l.out}, DType::bf16);     // (M, out)
    const Tensor dx = ctx.empty(Shape{l.rows, l.in}, DType::bf16);     // (M, in)
    const Tensor dw = ctx.empty(Shape{l.out, l.in}, DType::f32);       // (out, in)
    const Tensor b = l.bias ? ctx.empty(Shape{l.out}, DType::bf16) : Tensor();
    const Tensor db = l.bias ? ctx.empty(Shape{l.out}, DType::f32) : Tensor();
    const Tensor pre = l.gelu_after ? ctx.empty(Shape{l.rows, l.out}, DType::bf16) : Tensor();
    const Tensor pre_in = l.dgelu_input ? ctx.empty(Shape{l.rows, l.in}, DType::bf16) : Tensor();
    for (const Tensor& t : {x, w, y, pre_in})
      if (t.defined()) ops::fill(ctx, t, 0.01);
    ops::fill(ctx, dw, 0.0);
    if (l.bias) ops::fill(ctx, db, 0.0);
    struct Pass {
      const char* name;
      int64_t m, k, n;
      std::function<void()> run;
    };
    const std::vector<Pass> passes = {
        {"fwd", l.rows, l.in, l.out,
         [&] {
           ops::matmul(ctx, y, x, w, false, true, 1.0, 0.0, b,
                       l.gelu_after ? ops::Epilogue::Gelu : ops::Epilogue::None, pre);
         }},
        {"dgrad", l.rows, l.out, l.in,
         [&] {
           ops::matmul(ctx, dx, y, w, false, false, 1.0, 0.0, Tensor(),
                       l.dgelu_input ? ops::Epilogue::DGelu : ops::Epilogue::None, pre_in);
         }},
        {"wgrad", l.out, l.rows, l.in,
         [&] {
           if (l.bias)
             ops::matmul_bias_grad(ctx, dw, y, x, true, false, 1.0, 1.0, db, true);
           else
             ops::matmul(ctx, dw, y, x, true, false, 1.0, 1.0);
         }},
    };
    for (const Pass& p : passes) {
      blas.set_tuning(kernels::cuda::MatmulTuning{});
      const double heuristic = median_device_ms(ctx, reps, 1, p.run);
      kernels::cuda::MatmulTuning on;
      on.enabled = true;
      on.after_uses = 1;
      blas.set_tuning(on);
      const double tuned = median_device_ms(ctx, reps, 1, p.run);  // the warm-up run times the candidates
      const double flop = 2.0 * double(p.m) * double(p.k) * double(p.n);
      std::printf("%-16s %-6s %-22s %10.1f %10.1f %7.3f\n", l.name, p.name,
                  str_cat("(", p.m, " x ", p.k, ") @ (", p.k, " x ", p.n, ")").c_str(),
                  flop / heuristic / 1e9, flop / tuned / 1e9, heuristic / tuned);
      total_heuristic += heuristic;
      total_tuned += tuned;
    }
  }
  std::printf("one block + head: heuristic %.3f ms, tuned %.3f ms (%.3fx)\n", total_heuristic,
              total_tuned, total_heuristic / total_tuned);
  return 0;
#else
  FSDP_THROW(DeviceError, "bench matmul-tuning: this build has no CUDA support (--config=cpu)");
#endif
}

}  // namespace fsdp::bench
