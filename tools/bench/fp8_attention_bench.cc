#include "tools/bench/fp8_attention_bench.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/fp8_attention_ops.h"
#include "kernels/fp8_ops.h"
#include "kernels/ops.h"
#include "runtime/core/context.h"
#include "runtime/core/error.h"
#include "runtime/train/recipe.h"
#include "tools/bench/device_timing.h"
#include "tools/bench/workload_flags.h"

namespace fsdp::bench {
namespace {

void usage(std::FILE* out) {
  std::fprintf(out,
               "usage: bench fp8-attention (--workload NAME | --config FILE) [--reps R]\n"
               "  Times on GPU 0 the causal attention of the recipe's model at its micro-batch,\n"
               "  forward and backward, in bf16 (cuDNN) and through cuDNN's FP8 graphs for each\n"
               "  choice of stored types (O in FP8 or bf16; dQ, dK, dV in bf16 or FP8); e4m3\n"
               "  forward, e5m2 backward. 'graph' is the fused kernel alone, 'with casts' adds\n"
               "  the amaxes, casts and scales of its FP8 inputs. TFLOP/s of the median of R\n"
               "  runs (causal FLOPs), and the error of each output against bf16's: |a - b| / |b|\n"
               "  over all elements (L2). Workloads: gpt2-124m, gpt-1.3b, llama-1b.\n");
}

// ||a - b|| / ||b|| over two f32 vectors.
double relative_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += double(a[i] - b[i]) * (a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

std::vector<float> host_f32(Context& ctx, const Tensor& t) {
  return ops::to_vector<float>(ctx, ops::cast(ctx, t, DType::f32));
}

// The values of FP8 bytes stored with `descale`.
std::vector<float> decoded(Context& ctx, const Tensor& bytes, kernels::Fp8Format f, float descale) {
  std::vector<float> out;
  for (uint8_t b : ops::to_vector<uint8_t>(ctx, bytes)) out.push_back(kernels::fp8_decode(b, f) * descale);
  return out;
}

}  // namespace

int run_fp8_attention_bench(const std::vector<std::string>& args) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line out at once, whatever follows
  const WorkloadFlags flags = parse_workload_flags(args, usage);
  if (flags.help) return 0;
  const train::Recipe recipe = train::load_recipe(flags.config, {});
  Context ctx(Device::cuda(0));
  std::string why;
  FSDP_CHECK(ops::fp8_available(ctx, &why), DeviceError, "bench fp8-attention: ", why);
  const auto& m = recipe.model;
  const int64_t B = recipe.train.micro_batch_size, T = m.seq_length, H = m.n_head,
                Hkv = m.n_kv_head, D = m.d_model / m.n_head;
  const double fwd_flop = 2.0 * B * H * double(T) * T * D;  // two products, half the scores
  const double bwd_flop = 2.5 * fwd_flop;
  std::printf("# bench fp8-attention: %s, B %lld, T %lld, H %lld, Hkv %lld, D %lld, median of %d\n",
              flags.config.c_str(), (long long)B, (long long)T, (long long)H, (long long)Hkv,
              (long long)D, flags.reps);

  auto normal = [&](const Shape& s, uint64_t key, double std) {
    Tensor t = ctx.empty(s, DType::bf16);
    ops::init_normal(ctx, t, 1234, key, 0, 0.0, std);
    return t;
  };
  const Shape qs{B, T, H, D}, kvs{B, T, Hkv, D};
  const Tensor q = normal(qs, 1, 1.0), k = normal(kvs, 2, 1.0), v = normal(kvs, 3, 1.0);
  const Tensor dout = normal(qs, 4, 1e-3);
  Tensor out = ctx.empty(qs, DType::bf16), lse = ctx.empty(Shape{B, H, T}, DType::f32);
  Tensor dq = ctx.empty(qs, DType::bf16), dk = ctx.empty(kvs, DType::bf16),
         dv = ctx.empty(kvs, DType::bf16);
  const double bf16_fwd = median_device_ms(ctx, flags.reps, 3, [&] {
    ops::attention_forward(ctx, out, lse, q, k, v);
  });
  const double bf16_bwd = median_device_ms(ctx, flags.reps, 3, [&] {
    ops::attention_backward(ctx, dq, dk, dv, dout, out, lse, q, k, v);
  });
  std::printf("%-34s %9s %9s %9s %9s\n", "precision", "fwd ms", "TFLOP/s", "bwd ms", "TFLOP/s");
  std::printf("%-34s %9.3f %9.1f %9.3f %9.1f\n", "bf16", bf16_fwd, fwd_flop / bf16_fwd * 1e-9,
              bf16_bwd, bwd_flop / bf16_bwd * 1e-9);
  const std::vector<float> ref_out = host_f32(ctx, out), ref_dq = host_f32(ctx, dq),
                           ref_dk = host_f32(ctx, dk), ref_dv = host_f32(ctx, dv);

  const kernels::Fp8Format e4m3 = kernels::Fp8Format::e4m3, e5m2 = kernels::Fp8Format::e5m2;
  auto amax_of = [&](const Tensor& x) {
    Tensor a = ctx.empty(Shape{1}, DType::f32);
    ops::fp8_amax(ctx, a, x);
    return a;
  };
  // x (B, T, h, D) bf16 -> its FP8 bytes, same shape.
  auto cast = [&](const Tensor& x, const Tensor& amax, kernels::Fp8Format f) {
    const Tensor rows = x.view(Shape{x.size(0) * x.size(1), x.size(2) * x.size(3)});
    return ops::fp8_quantize(ctx, rows, amax, f, true, false).rows.data.view(x.shape());
  };
  for (const bool grads_fp8 : {true, false}) {  // bf16 gradients last: an engine may crash on them
    kernels::Fp8AttentionTypes types;
    types.forward = e4m3;
    types.backward = e5m2;
    types.out_fp8 = true;
    types.grads_fp8 = grads_fp8;
    const std::string name = std::string("fp8, O fp8, dQKV ") + (grads_fp8 ? "e5m2" : "bf16");
    std::printf("# %s: building the plans\n", name.c_str());
    if (!ops::fp8_attention_supported(ctx, qs, Hkv, types, &why)) {
      std::printf("%-34s refused: %s\n", name.c_str(), why.c_str());
      continue;
    }
    const Tensor scales = ctx.empty(Shape{kernels::kFp8ScalarCount}, DType::f32);
    const Tensor amaxes = ctx.empty(Shape{kernels::kFp8AmaxCount}, DType::f32);
    Tensor aq = amax_of(q), ak = amax_of(k), av = amax_of(v), ado = amax_of(dout);
    ops::fp8_attention_scales(ctx, scales, aq, ak, av, ado, D, T, types);
    const Tensor q8 = cast(q, aq, e4m3), k8 = cast(k, ak, e4m3), v8 = cast(v, av, e4m3),
                 do8 = cast(dout, ado, e5m2);
    const Tensor o8 = ctx.empty(qs, DType::u8);
    const DType gd = grads_fp8 ? DType::u8 : DType::bf16;
    Tensor gq = ctx.empty(qs, gd), gk = ctx.empty(kvs, gd), gv = ctx.empty(kvs, gd);
    const double fwd = median_device_ms(ctx, flags.reps, 3, [&] {
      ops::attention_forward_fp8(ctx, o8, lse, q8, k8, v8, scales, amaxes, types);
    });
    const double fwd_casts = median_device_ms(ctx, flags.reps, 3, [&] {
      aq = amax_of(q), ak = amax_of(k), av = amax_of(v);
      ops::fp8_attention_scales(ctx, scales, aq, ak, av, ado, D, T, types);
      cast(q, aq, e4m3), cast(k, ak, e4m3), cast(v, av, e4m3);
      ops::attention_forward_fp8(ctx, o8, lse, q8, k8, v8, scales, amaxes, types);
    });
    const double bwd = median_device_ms(ctx, flags.reps, 3, [&] {
      ops::attention_backward_fp8(ctx, gq, gk, gv, do8, o8, lse, q8, k8, v8, scales, amaxes, types);
    });
    const double bwd_casts = median_device_ms(ctx, flags.reps, 3, [&] {
      ado = amax_of(dout);
      ops::fp8_attention_scales(ctx, scales, aq, ak, av, ado, D, T, types);
      cast(dout, ado, e5m2);
      ops::attention_backward_fp8(ctx, gq, gk, gv, do8, o8, lse, q8, k8, v8, scales, amaxes, types);
    });
    std::printf("%-34s %9.3f %9.1f %9.3f %9.1f  (graph alone; x%.2f / x%.2f of bf16)\n",
                name.c_str(), fwd, fwd_flop / fwd * 1e-9, bwd, bwd_flop / bwd * 1e-9,
                bf16_fwd / fwd, bf16_bwd / bwd);
    std::printf("%-34s %9.3f %9.1f %9.3f %9.1f  (with casts; x%.2f / x%.2f of bf16)\n", "",
                fwd_casts, fwd_flop / fwd_casts * 1e-9, bwd_casts, bwd_flop / bwd_casts * 1e-9,
                bf16_fwd / fwd_casts, bf16_bwd / bwd_casts);
    const std::vector<float> s = ops::to_vector<float>(ctx, scales);
    const std::vector<float> a = ops::to_vector<float>(ctx, amaxes);
    const float ds = 1.0f / s[kernels::kFp8ScaleO];
    auto grad = [&](const Tensor& t, int slot) {
      return grads_fp8 ? decoded(ctx, t, e5m2, 1.0f / s[slot]) : host_f32(ctx, t);
    };
    std::printf("  error against bf16 (L2): O %.4f, dQ %.4f, dK %.4f, dV %.4f; amax S %.3g, "
                "O %.3g, dS %.3g (scale bound %.3g), dQ %.3g, dK %.3g, dV %.3g\n",
                relative_l2(decoded(ctx, o8, e4m3, ds), ref_out),
                relative_l2(grad(gq, kernels::kFp8ScaleDQ), ref_dq),
                relative_l2(grad(gk, kernels::kFp8ScaleDK), ref_dk),
                relative_l2(grad(gv, kernels::kFp8ScaleDV), ref_dv), a[kernels::kFp8AmaxS],
                a[kernels::kFp8AmaxO], a[kernels::kFp8AmaxDS],
                kernels::fp8_max(e5m2) / s[kernels::kFp8ScaleDS], a[kernels::kFp8AmaxDQ],
                a[kernels::kFp8AmaxDK], a[kernels::kFp8AmaxDV]);
  }
  return 0;
}

}  // namespace fsdp::bench
