#include "tools/bench/fp8_matmul_bench.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/fp8_math.h"
#include "kernels/nn_ops.h"
#include "kernels/ops.h"
#include "runtime/core/context.h"
#include "runtime/core/error.h"
#include "runtime/core/stream.h"

namespace fsdp::bench {
namespace {

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: bench fp8-matmul [--model 124m|1.3b|both] [--tokens N] [--reps R]\n"
               "  Times on GPU 0 (compute capability 8.9+) each linear layer of a GPT-2 block\n"
               "  (attention qkv and proj, the MLP's fc and proj) as an FP8 linear layer runs\n"
               "  its three products, against the same products in bf16: the forward\n"
               "  y = x W^T (e4m3 x e4m3 -> bf16), the input gradient dx = dy W (e5m2 x e4m3 ->\n"
               "  bf16) and the weight gradient dW += dy^T x (e5m2 x e4m3 accumulated into f32).\n"
               "  Prints per product the median of R runs after two warm-ups in ms and TFLOP/s,\n"
               "  bf16 and FP8, FP8's speed-up, and FP8 with the quantization the layer runs\n"
               "  for that product (amax, scale and cast of the activation or gradient operand,\n"
               "  with its transpose where the layer makes it; the weight's too). GPT-2 124M:\n"
               "  d 768, d_ff 3072; 1.3B: d 2048, d_ff 8192; N tokens (default 4096).\n");
}

// The median over `reps` runs of `work`, in ms, after two warm-ups (GPU events).
double median_ms(Context& ctx, int reps, const std::function<void()>& work) {
  for (int i = 0; i < 2; ++i) work();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    Event start = Event::create(ctx.device(), true), end = Event::create(ctx.device(), true);
    start.record(ctx.stream());
    work();
    end.record(ctx.stream());
    end.synchronize();
    ms.push_back(Event::elapsed_ms(start, end));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// A matrix quantized to FP8 with its scales; q and/or q_t (its transpose).
struct Quantized {
  Tensor q, q_t, scales;
};

Quantized quantized(Context& ctx, const Tensor& x, DType fp8, bool plain, bool transposed) {
  Quantized r;
  r.scales = ctx.empty(Shape{kernels::kFp8Scales}, DType::f32);
  if (plain) r.q = ctx.empty(x.shape(), fp8);
  if (transposed) r.q_t = ctx.empty(Shape{x.size(1), x.size(0)}, fp8);
  return r;
}

void quantize(Context& ctx, const Tensor& x, Quantized& r, DType fp8) {
  ops::fp8_scales(ctx, r.scales, x, fp8);
  ops::fp8_quantize(ctx, r.q, r.q_t, x, r.scales);
}

struct Layer {
  const char* name;
  int64_t in, out;  // features: W (out, in)
};

void bench_layer(Context& ctx, const std::string& model, const Layer& l, int64_t tokens, int reps) {
  const DType bf = DType::bf16, e4 = DType::f8e4m3, e5 = DType::f8e5m2;
  const Tensor x = ctx.empty(Shape{tokens, l.in}, bf);    // (T, in)
  const Tensor w = ctx.empty(Shape{l.out, l.in}, bf);     // (out, in)
  const Tensor dy = ctx.empty(Shape{tokens, l.out}, bf);  // (T, out)
  const Tensor y = ctx.empty(Shape{tokens, l.out}, bf), dx = ctx.empty(Shape{tokens, l.in}, bf);
  const Tensor dw = ctx.empty(Shape{l.out, l.in}, DType::f32);  // the f32 gradient
  ops::init_normal(ctx, x, 1, 1, 0, 0.0, 1.0);
  ops::init_normal(ctx, w, 1, 2, 0, 0.0, 0.02);
  ops::init_normal(ctx, dy, 1, 3, 0, 0.0, 1e-3);
  ops::fill(ctx, dw, 0.0);
  // What the FP8 layer quantizes: x as stored and transposed (forward), the weight as stored
  // (forward) and transposed (dgrad), dy as stored and transposed (dgrad, wgrad).
  Quantized xq = quantized(ctx, x, e4, true, true), wq = quantized(ctx, w, e4, true, false),
            wtq = quantized(ctx, w, e4, false, true), dyq = quantized(ctx, dy, e5, true, true);
  quantize(ctx, x, xq, e4);
  quantize(ctx, w, wq, e4);
  quantize(ctx, w, wtq, e4);
  quantize(ctx, dy, dyq, e5);

  struct Pass {
    const char* what;
    int64_t m, n, k;
    std::function<void()> bf16, fp8, quant;
  };
  const std::vector<Pass> passes = {
      {"forward", tokens, l.out, l.in,
       [&] { ops::matmul(ctx, y, x, w, false, true); },
       [&] { ops::fp8_matmul(ctx, y, xq.q, xq.scales, wq.q, wq.scales); },
       [&] {
         quantize(ctx, x, xq, e4);
         quantize(ctx, w, wq, e4);
       }},
      {"dgrad", tokens, l.in, l.out,
       [&] { ops::matmul(ctx, dx, dy, w, false, false); },
       [&] { ops::fp8_matmul(ctx, dx, dyq.q, dyq.scales, wtq.q_t, wtq.scales); },
       [&] {
         quantize(ctx, dy, dyq, e5);
         quantize(ctx, w, wtq, e4);
       }},
      {"wgrad", l.out, l.in, tokens,
       [&] { ops::matmul(ctx, dw, dy, x, true, false, 1.0, 1.0); },
       [&] { ops::fp8_matmul(ctx, dw, dyq.q_t, dyq.scales, xq.q_t, xq.scales, 1.0); },
       [] {}},  // its operands' transposes come from the quantizations above
  };
  for (const Pass& p : passes) {
    const double flop = 2.0 * double(p.m) * double(p.n) * double(p.k);
    const double t_bf16 = median_ms(ctx, reps, p.bf16);
    const double t_fp8 = median_ms(ctx, reps, p.fp8);
    const double t_both = median_ms(ctx, reps, [&] {
      p.quant();
      p.fp8();
    });
    auto tflops = [&](double ms) { return flop / (ms * 1e-3) / 1e12; };
    std::printf("%-5s %-10s %-8s %6lld %6lld %6lld | %8.3f %7.1f | %8.3f %7.1f | %5.2fx | %8.3f %7.1f\n",
                model.c_str(), l.name, p.what, (long long)p.m, (long long)p.n, (long long)p.k,
                t_bf16, tflops(t_bf16), t_fp8, tflops(t_fp8), t_bf16 / t_fp8, t_both, tflops(t_both));
  }
}

}  // namespace

int run_fp8_matmul_bench(const std::vector<std::string>& args) {
  std::string model = "both";
  int64_t tokens = 4096;
  int reps = 20;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      FSDP_CHECK(i + 1 < args.size(), ConfigError, a, " needs a value");
      return args[++i];
    };
    if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    } else if (a == "--model") {
      model = value();
    } else if (a == "--tokens") {
      tokens = std::stoll(value());
    } else if (a == "--reps") {
      reps = std::stoi(value());
    } else {
      usage(stderr);
      FSDP_THROW(ConfigError, "unknown flag ", a);
    }
  }
  FSDP_CHECK(model == "124m" || model == "1.3b" || model == "both", ConfigError,
             "--model is 124m, 1.3b or both, got '", model, "'");
  FSDP_CHECK(tokens > 0 && tokens % 16 == 0 && reps > 0, ConfigError,
             "--tokens must be a positive multiple of 16 (FP8 matmuls) and "
             "--reps positive");
  FSDP_CHECK(cuda_device_count() > 0, DeviceError, "a GPU is needed");
  const int cc = cuda_compute_capability(0);
  FSDP_CHECK(cc >= 89, DeviceError, "FP8 tensor cores are needed (compute "
             "capability 8.9+), GPU 0 has ", cc / 10, ".", cc % 10);
  Context ctx(Device::cuda(0));
  std::printf("fp8 matmul: %lld tokens, median of %d; ms and TFLOP/s; FP8+quant adds the "
              "quantization the layer runs for the product\n",
              (long long)tokens, reps);
  std::printf("%-5s %-10s %-8s %6s %6s %6s | %8s %7s | %8s %7s | %6s | %8s %7s\n", "model",
              "layer", "product", "M", "N", "K", "bf16 ms", "TFLOP/s", "fp8 ms", "TFLOP/s",
              "speed", "+quant", "TFLOP/s");
  struct Model {
    const char* name;
    int64_t d, ff;
  };
  for (const Model& m : {Model{"124m", 768, 3072}, Model{"1.3b", 2048, 8192}}) {
    if (model != "both" && model != m.name) continue;
    for (const Layer& l : {Layer{"attn.qkv", m.d, 3 * m.d}, Layer{"attn.proj", m.d, m.d},
                           Layer{"mlp.fc", m.d, m.ff}, Layer{"mlp.proj", m.ff, m.d}})
      bench_layer(ctx, m.name, l, tokens, reps);
  }
  return 0;
}

}  // namespace fsdp::bench
