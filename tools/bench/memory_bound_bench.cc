#include "tools/bench/memory_bound_bench.h"

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
               "usage: bench memory-bound (--workload NAME | --config FILE) [--reps R]\n"
               "  Times on GPU 0, at the recipe's micro-batch (rows = micro_batch_size x\n"
               "  seq_length) and widths, the memory-bound kernels of a training step in bf16:\n"
               "  the norm forward (alone and with the residual add fused in) and backward, the\n"
               "  residual add, the MLP activation forward and backward, the bias gradients\n"
               "  (GPT-2), FP8's amax and casts, and AdamW over 64M parameters. Each row: the\n"
               "  bytes the kernel must move at least, the median of R runs, GB/s, and the share\n"
               "  of a device-to-device copy's GB/s measured first in the same run. Workloads:\n"
               "  gpt2-124m, gpt-1.3b, llama-1b.\n");
}

struct Row {
  std::string name;
  double bytes;  // the least the kernel reads and writes
  std::function<void()> run;
};

}  // namespace

int run_memory_bound_bench(const std::vector<std::string>& args) {
  const WorkloadFlags flags = parse_workload_flags(args, usage);
  if (flags.help) return 0;
  const std::string& config = flags.config;
  const int reps = flags.reps;
  const train::Recipe recipe = train::load_recipe(config, {});
  const train::ModelSection& m = recipe.model;
  const bool gpt2 = m.family == "gpt2";
  const int64_t rows = int64_t(recipe.train.micro_batch_size) * m.seq_length;
  const int64_t c = m.d_model, f = m.d_ff;
  Context ctx(Device::cuda(0));
  auto tensor = [&](Shape shape, DType dtype, uint64_t key) {  // N(0, 1) values
    const Tensor t = ctx.empty(shape, dtype);
    ops::init_normal(ctx, t, 1, key, 0, 0.0, 1.0);
    return t;
  };
  const DType bf16 = DType::bf16, f32 = DType::f32;
  const double rc = double(rows) * double(c), rf = double(rows) * double(f);
  // Activations (rows, C) and (rows, F) or (rows, 2F), and the norm's parameters.
  const Tensor x = tensor(Shape{rows, c}, bf16, 1), residual = tensor(Shape{rows, c}, bf16, 2);
  const Tensor dout = tensor(Shape{rows, c}, bf16, 3), out = ctx.empty(Shape{rows, c}, bf16);
  const Tensor sum = ctx.empty(Shape{rows, c}, bf16), dx = ctx.empty(Shape{rows, c}, bf16);
  const Tensor weight = tensor(Shape{c}, bf16, 4), bias = tensor(Shape{c}, bf16, 5);
  const Tensor dweight = ctx.empty(Shape{c}, f32), dbias = ctx.empty(Shape{c}, f32);
  const Tensor mean = ctx.empty(Shape{rows}, f32), rstd = ctx.empty(Shape{rows}, f32);
  const int64_t act_in = gpt2 ? f : 2 * f;  // the activation's input width (SwiGLU: gate | up)
  const Tensor h = tensor(Shape{rows, act_in}, bf16, 6), dh = ctx.empty(Shape{rows, act_in}, bf16);
  const Tensor a = ctx.empty(Shape{rows, f}, bf16), da = tensor(Shape{rows, f}, bf16, 7);
  const Tensor dbias_f = ctx.empty(Shape{f}, f32), amax = ctx.empty(Shape{1}, f32);
  const Tensor record = ctx.empty(Shape{1}, f32);
  ops::fill(ctx, amax, 4.0);
  const int64_t params = int64_t(64) << 20;
  const Tensor p = tensor(Shape{params}, f32, 8), g = tensor(Shape{params}, f32, 9);
  const Tensor m1 = ctx.empty(Shape{params}, f32), m2 = ctx.empty(Shape{params}, f32);
  const Tensor p_copy = ctx.empty(Shape{params}, bf16);
  ops::fill(ctx, m1, 0.0);
  ops::fill(ctx, m2, 0.0);
  ops::AdamWParams adam;
  adam.lr = 1e-4;
  adam.weight_decay = 0.1;
  const Tensor big_src = ctx.empty(Shape{int64_t(512) << 20}, bf16);  // 1 GiB
  const Tensor big_dst = ctx.empty(Shape{int64_t(512) << 20}, bf16);
  ops::fill(ctx, big_src, 1.0);

  std::vector<Row> table;
  table.push_back({"device-to-device copy, 1 GiB", 2.0 * double(big_src.numel()) * 2,
                   [&] { ops::copy(ctx, big_dst, big_src); }});
  const std::string norm = gpt2 ? "LayerNorm" : "RMSNorm";
  // Norm forward: x in, out and the row statistics out.
  table.push_back({norm + " forward", rc * 4 + double(rows) * (gpt2 ? 8 : 4), [&] {
                     if (gpt2) ops::layernorm_forward(ctx, out, mean, rstd, x, weight, bias, 1e-5);
                     else ops::rmsnorm_forward(ctx, out, rstd, x, weight, 1e-5);
                   }});
  table.push_back({"residual add + " + norm + " forward", rc * 8, [&] {
                     if (gpt2)
                       ops::add_layernorm_forward(ctx, sum, out, mean, rstd, x, residual, weight, bias, 1e-5);
                     else
                       ops::add_rmsnorm_forward(ctx, sum, out, rstd, x, residual, weight, 1e-5);
                   }});
  // Backward: dout and x in, the residual stream's gradient added, dx out.
  table.push_back({norm + " backward (+ residual gradient)", rc * 8, [&] {
                     if (gpt2)
                       ops::layernorm_backward(ctx, dx, dweight, dbias, dout, x, weight, mean, rstd,
                                               false, false, residual);
                     else
                       ops::rmsnorm_backward(ctx, dx, dweight, dout, x, weight, rstd, false, false,
                                             residual);
                   }});
  table.push_back({"residual add", rc * 6, [&] { ops::add(ctx, sum, x, residual); }});
  if (gpt2) {
    table.push_back({"GELU forward", rf * 4, [&] { ops::gelu_forward(ctx, a, h); }});
    table.push_back({"GELU backward", rf * 6, [&] { ops::gelu_backward(ctx, dh, da, h); }});
    table.push_back({"bias gradient (rows, C)", rc * 2,
                     [&] { ops::bias_backward(ctx, dbias, dout, false); }});
    table.push_back({"bias gradient (rows, F)", rf * 2,
                     [&] { ops::bias_backward(ctx, dbias_f, da, false); }});
  } else {
    table.push_back({"SwiGLU forward", rf * 6, [&] { ops::swiglu_forward(ctx, a, h); }});
    table.push_back({"SwiGLU backward", rf * 10, [&] { ops::swiglu_backward(ctx, dh, da, h); }});
  }
  // Rotary embeddings (Llama): q and k rotated out of the fused projection into tensors of
  // their own, as the attention does (each element read once and written once).
  const int64_t heads = m.n_head, kv_heads = m.n_kv_head;
  const int64_t head_dim = c / heads;
  const Tensor qkv = gpt2 ? Tensor()
                          : tensor(Shape{int64_t(recipe.train.micro_batch_size), m.seq_length,
                                         heads + 2 * kv_heads, head_dim},
                                   bf16, 10);  // (B, T, H + 2 Hkv, D)
  const Tensor q_rot = gpt2 ? Tensor() : ctx.empty(qkv.slice(2, 0, heads).shape(), bf16);
  const Tensor k_rot = gpt2 ? Tensor() : ctx.empty(qkv.slice(2, heads, heads + kv_heads).shape(), bf16);
  if (!gpt2)
    table.push_back({"RoPE of q and k, out of the fused projection",
                     double(rows) * double((heads + kv_heads) * head_dim) * 4, [&] {
                       ops::rope(ctx, q_rot, qkv.slice(2, 0, heads), m.rope_theta, false);
                       ops::rope(ctx, k_rot, qkv.slice(2, heads, heads + kv_heads), m.rope_theta, false);
                     }});
  table.push_back({"FP8 amax (rows, C)", rc * 2, [&] { ops::fp8_amax(ctx, record, x); }});
  table.push_back({"FP8 cast, both layouts (rows, C)", rc * 4, [&] {
                     (void)ops::fp8_quantize(ctx, x, amax, ops::Fp8Format::e4m3, true, true);
                   }});
  table.push_back({"FP8 cast, both layouts, amax recorded", rc * 4, [&] {
                     (void)ops::fp8_quantize(ctx, x, amax, ops::Fp8Format::e4m3, true, true, Tensor(),
                                             record);
                   }});
  // The MLP's casts that compute their operand as they read the activation's tensors
  // (delayed scaling: a given amax, the step's recorded): fc's output gradient from da and
  // h, both layouts, with fc's bias gradient; SwiGLU's output, proj's input, both layouts.
  const ops::Fp8CastSource grad_source =
      gpt2 ? ops::Fp8CastSource::gelu_grad : ops::Fp8CastSource::swiglu_grad;
  table.push_back({std::string("FP8 cast of the ") + (gpt2 ? "GELU" : "SwiGLU") + " gradient, both layouts",
                   rf * 2 + double(rows) * double(act_in) * 4, [&] {
                     (void)ops::fp8_quantize_activation(ctx, grad_source, da, h, amax,
                                                        ops::Fp8Format::e5m2, true, true,
                                                        gpt2 ? dbias_f : Tensor(), record);
                   }});
  if (!gpt2)
    table.push_back({"FP8 cast of SwiGLU's output, both layouts", rf * 6, [&] {
                       (void)ops::fp8_quantize_activation(ctx, ops::Fp8CastSource::swiglu, Tensor(), h,
                                                          amax, ops::Fp8Format::e4m3, true, true,
                                                          Tensor(), record);
                     }});
  // Block scaling (the blockwise recipe): one scale per 1 x 128 block of each layout.
  table.push_back({"FP8 block cast 1x128, both layouts (rows, C)", rc * 4, [&] {
                     (void)ops::fp8_quantize_blocks(ctx, x, ops::Fp8Format::e4m3,
                                                    ops::Fp8Granularity::block_1x128, true, true);
                   }});
  // f32 master, gradient and moments read; master and moments written; the bf16 copy.
  table.push_back({"AdamW, 64M parameters", double(params) * 30, [&] {
                     ops::adamw_step(ctx, p, g, m1, m2, adam, p_copy);
                   }});

  std::printf("# bench memory-bound: %s, rows %lld, C %lld, F %lld, bf16, median of %d\n",
              config.c_str(), (long long)rows, (long long)c, (long long)f, reps);
  std::printf("%-42s %10s %10s %9s %8s\n", "kernel", "MB moved", "us", "GB/s", "of copy");
  double copy_gbs = 0;
  for (const Row& r : table) {
    const double ms = median_device_ms(ctx, reps, 2, r.run);
    const double gbs = r.bytes / (ms * 1e-3) / 1e9;
    if (copy_gbs == 0) copy_gbs = gbs;
    std::printf("%-42s %10.1f %10.1f %9.0f %7.0f%%\n", r.name.c_str(), r.bytes / 1e6, ms * 1e3, gbs,
                100.0 * gbs / copy_gbs);
  }
  return 0;
}

}  // namespace fsdp::bench
