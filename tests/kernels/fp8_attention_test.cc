// FP8 attention's CPU simulation (kernels/cpu/fp8_attention.h, the reference of the GPU twins)
// against exact attention (f64) on the dequantized inputs: what remains is the rounding of P,
// O, dS and the stored gradients to FP8 at the scales kernels/fp8_attention.h gives, so the
// outputs land within that rounding and the amaxes within the bounds the scales assume. A
// wrong scale, layout or head grouping is off by O(1).
#include <cmath>
#include <vector>

#include "kernels/fp8_attention_ops.h"
#include "kernels/fp8_ops.h"
#include "kernels/nn_ops.h"
#include "kernels/ops.h"
#include "tests/kernels/nn_test_util.h"
#include "tests/test_support.h"

using namespace fsdp;
using kernels::Fp8Format;

namespace {

// ||a - b|| / ||b||.
double relative_l2(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

// The values a tensor stands for: FP8 bytes decoded and divided by `scale`, or the tensor's own.
std::vector<double> stood_for(Context& ctx, const Tensor& t, Fp8Format f, float scale) {
  if (t.dtype() != DType::u8) return testing::values(ctx, t);
  std::vector<double> out;
  for (uint8_t b : ops::to_vector<uint8_t>(ctx, t)) out.push_back(double(kernels::fp8_decode(b, f)) / scale);
  return out;
}

struct Quantized {
  Tensor bytes;      // (B, T, heads, D) u8
  Tensor amax;       // (1) f32
  Tensor values;     // (B, T, heads, D) f64: what the bytes stand for
};

Quantized quantize(Context& ctx, const Tensor& x, Fp8Format f) {
  Quantized q;
  q.amax = ctx.empty(Shape{1}, DType::f32);
  ops::fp8_amax(ctx, q.amax, x);
  const Tensor rows = x.view(Shape{x.size(0) * x.size(1), x.size(2) * x.size(3)});
  const ops::Fp8Quantized r = ops::fp8_quantize(ctx, rows, q.amax, f, true, false);
  q.bytes = r.rows.data.view(x.shape());
  const float descale = testing::values(ctx, r.rows.scale_inv)[0];
  std::vector<double> v;
  for (uint8_t b : ops::to_vector<uint8_t>(ctx, q.bytes)) v.push_back(double(kernels::fp8_decode(b, f)) * descale);
  q.values = ops::from_host(ctx, v, x.shape());
  return q;
}

}  // namespace

TEST_CASE("FP8 attention's CPU simulation is attention on its inputs within FP8 rounding",
          "[fp8][attention]") {
  Context ctx(Device::cpu());
  const int64_t B = 2, T = 48, H = 4, Hkv = 2, D = 32;
  const Shape qs{B, T, H, D}, kvs{B, T, Hkv, D};
  const Quantized q = quantize(ctx, testing::random_tensor(ctx, qs, DType::f32, 11, -2, 2), Fp8Format::e4m3);
  const Quantized k = quantize(ctx, testing::random_tensor(ctx, kvs, DType::f32, 12, -2, 2), Fp8Format::e4m3);
  const Quantized v = quantize(ctx, testing::random_tensor(ctx, kvs, DType::f32, 13), Fp8Format::e4m3);
  const Quantized dout =
      quantize(ctx, testing::random_tensor(ctx, qs, DType::f32, 14, -1e-3, 1e-3), Fp8Format::e5m2);

  // Exact attention (f64) of the values the FP8 inputs stand for.
  const Tensor out_ref = ctx.empty(qs, DType::f64), lse_ref = ctx.empty(Shape{B, H, T}, DType::f64);
  ops::attention_forward(ctx, out_ref, lse_ref, q.values, k.values, v.values);
  const Tensor dq_ref = ctx.empty(qs, DType::f64), dk_ref = ctx.empty(kvs, DType::f64),
               dv_ref = ctx.empty(kvs, DType::f64);
  ops::attention_backward(ctx, dq_ref, dk_ref, dv_ref, dout.values, out_ref, lse_ref, q.values,
                          k.values, v.values);

  for (const bool fp8_outputs : {true, false}) {
    INFO((fp8_outputs ? "O, dQ, dK, dV in FP8" : "O, dQ, dK, dV in bf16"));
    ops::Fp8AttentionTypes types;
    types.out_fp8 = types.grads_fp8 = fp8_outputs;
    const Tensor scales = ctx.empty(Shape{kernels::kFp8ScalarCount}, DType::f32);
    ops::fp8_attention_scales(ctx, scales, q.amax, k.amax, v.amax, dout.amax, D, T, types);
    const std::vector<double> s = testing::values(ctx, scales);
    const Tensor amaxes = ctx.empty(Shape{kernels::kFp8AmaxCount}, DType::f32);
    const DType stored = fp8_outputs ? DType::u8 : DType::bf16;
    const Tensor out = ctx.empty(qs, stored), lse = ctx.empty(Shape{B, H, T}, DType::f32);
    ops::attention_forward_fp8(ctx, out, lse, q.bytes, k.bytes, v.bytes, scales, amaxes, types);
    // The backward reads O in FP8: the forward's bytes, or the bf16 O quantized as it would be.
    Tensor out8 = out;
    if (!fp8_outputs) {
      std::vector<uint8_t> bytes;
      for (double x : testing::values(ctx, out))
        bytes.push_back(kernels::fp8_encode(float(x) / float(s[kernels::kFp8DescaleO]), Fp8Format::e4m3));
      out8 = ops::from_host(ctx, bytes, qs);
    }
    const Tensor dq = ctx.empty(qs, stored), dk = ctx.empty(kvs, stored), dv = ctx.empty(kvs, stored);
    ops::attention_backward_fp8(ctx, dq, dk, dv, dout.bytes, out8, lse, q.bytes, k.bytes, v.bytes,
                                scales, amaxes, types);
    const std::vector<double> a = testing::values(ctx, amaxes);

    // lse comes from exact products of FP8 values summed in f32: f32 rounding only.
    CHECK(testing::max_rel_diff(testing::values(ctx, lse), testing::values(ctx, lse_ref), 1.0) < 1e-5);
    // The bounds below are the measured errors with a third of room (O 0.037 / 0.026 with O
    // in FP8 / bf16; dQ 0.084 / 0.065, dK 0.080 / 0.062, dV 0.059 / 0.025). A wrong scale,
    // layout or grouping gives errors of order 1; reading O with a descale 8/9 off (the
    // backward's Delta off by 1/8) gave dQ 0.148 and dK 0.142.
    // O: P rounded to e4m3 (relative steps of 1/16 to 1/8), then O itself when stored in e4m3.
    const double o_err = relative_l2(stood_for(ctx, out, Fp8Format::e4m3, float(s[kernels::kFp8ScaleO])),
                                     testing::values(ctx, out_ref));
    CHECK(o_err < 0.05);
    CHECK(o_err > 1e-4);  // P really is rounded to FP8
    // The gradients: dS rounded to e5m2 (steps of 1/8 to 1/4), then the stored values too.
    const Fp8Format g = Fp8Format::e5m2;
    const double qk_bound = fp8_outputs ? 0.115 : 0.09, v_bound = fp8_outputs ? 0.08 : 0.035;
    CHECK(relative_l2(stood_for(ctx, dq, g, float(s[kernels::kFp8ScaleDQ])), testing::values(ctx, dq_ref)) < qk_bound);
    CHECK(relative_l2(stood_for(ctx, dk, g, float(s[kernels::kFp8ScaleDK])), testing::values(ctx, dk_ref)) < qk_bound);
    CHECK(relative_l2(stood_for(ctx, dv, g, float(s[kernels::kFp8ScaleDV])), testing::values(ctx, dv_ref)) < v_bound);
    // The amaxes sit inside the bounds the scales were drawn from.
    CHECK(a[kernels::kFp8AmaxS] <= 1.0);
    CHECK(a[kernels::kFp8AmaxS] > 0.2);
    // O can pass |V|max a little (P's rounded values sum past 1), never its 9/8 headroom, so
    // no byte of O saturates.
    CHECK(a[kernels::kFp8AmaxO] <= kernels::kFp8RoundingHeadroom * testing::values(ctx, v.amax)[0]);
    if (fp8_outputs)
      for (uint8_t b : ops::to_vector<uint8_t>(ctx, out))
        REQUIRE(std::fabs(kernels::fp8_decode(b, Fp8Format::e4m3)) < kernels::fp8_max(Fp8Format::e4m3));
    CHECK(a[kernels::kFp8AmaxDS] <= kernels::fp8_max(g) * s[kernels::kFp8DescaleDS]);
    CHECK(a[kernels::kFp8AmaxDS] > 0.0);
  }
}
