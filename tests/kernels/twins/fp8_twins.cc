// FP8 quantization (kernels/cuda/fp8.h) against the CPU twin, bit for bit: the amax and the
// scales, the FP8 bytes and their transpose. Every bf16 value cast at scale 1 (both formats:
// ties, subnormals, saturation, infinities, NaN), and tensors whose magnitudes span 50
// binades, so that after scaling they cover every FP8 exponent, the subnormals and the
// underflow to zero; odd shapes (the one-element path and the tile edges) and GPT-2's (the
// 4-wide path). The GPU side needs FP8 conversions in hardware: compute capability 8.9+.
#include <cmath>
#include <random>

#include "kernels/fp8_math.h"
#include "kernels/nn_ops.h"
#include "kernels/ops.h"
#include "tests/kernels/twin_harness.h"

namespace fsdp::testing {
namespace {

const Tolerance kBytes = Tolerance::exact("the hardware's cvt.rn.satfinite, which the CPU twin rounds like");
const Tolerance kScales = Tolerance::exact("a max is exact in any order; one IEEE division each");

// `v` (representable in dt) as a dt tensor on the side, held in s.dtype(dt).
Tensor exact_input(TwinSide& s, const std::vector<double>& v, const Shape& shape, DType dt) {
  return ops::from_vector(s.ctx(), v, shape, s.dtype(dt));
}

// Quantizes x on the side and records the scales and both layouts' bytes.
void quantize_and_record(TwinSide& s, const Tensor& x, DType fp8, bool record_scales) {
  Context& ctx = s.ctx();
  const int64_t r = x.size(0), c = x.size(1);
  const Tensor scales = ctx.empty(Shape{kernels::kFp8Scales}, DType::f32);
  ops::fp8_scales(ctx, scales, x, fp8);
  const Tensor q = ctx.empty(Shape{r, c}, fp8), q_t = ctx.empty(Shape{c, r}, fp8);
  ops::fp8_quantize(ctx, q, q_t, x, scales);
  if (record_scales) s.output("amax, scale, scale_inv", scales, kScales);
  s.output("bytes", q.reinterpret(DType::u8), kBytes);
  s.output("transposed bytes", q_t.reinterpret(DType::u8), kBytes);
  // The transposed-only and plain-only launches write the same bytes.
  const Tensor only_t = ctx.empty(Shape{c, r}, fp8);
  ops::fp8_quantize(ctx, Tensor(), only_t, x, scales);
  s.expect(s.values(only_t.reinterpret(DType::u8)) == s.values(q_t.reinterpret(DType::u8)),
           "the transpose alone equals the transpose written beside the bytes");
}

// Every bf16 bit pattern: the infinities make amax infinite and the scale 1.
void every_bf16_case(DType fp8) {
  register_twin({"fp8", str_cat("fp8_quantize every bf16 value to ", dtype_name(fp8)), [=](TwinSide& s) {
    std::vector<double> v(65536);
    for (uint32_t h = 0; h < 65536; ++h) v[h] = double(bits_float(h << 16));
    const Tensor x = exact_input(s, v, Shape{256, 256}, DType::bf16);
    quantize_and_record(s, x, fp8, false);
    const Tensor scales = s.ctx().empty(Shape{kernels::kFp8Scales}, DType::f32);
    ops::fp8_scales(s.ctx(), scales, x, fp8);
    const std::vector<double> sv = s.values(scales);
    s.expect(std::isinf(sv[kernels::kFp8Amax]) && sv[kernels::kFp8Scale] == 1.0,
             "an infinite amax gives scale 1");
  }});
}

// Magnitudes 2^U(-40, 10), random signs, a few NaN (left out of amax, cast to NaN).
void wide_range_case(const Shape& shape, DType in, DType fp8) {
  const std::string name = str_cat("fp8_quantize 50 binades ", shape_name(shape), " ",
                                   dtype_name(in), " to ", dtype_name(fp8));
  register_twin({"fp8", name, [=](TwinSide& s) {
    std::mt19937 rng(uint32_t(shape.numel()) + 17);
    std::uniform_real_distribution<double> e(-40, 10), sign(0, 1);
    std::vector<double> v(size_t(shape.numel()));
    for (size_t i = 0; i < v.size(); ++i) {
      const float f = float((sign(rng) < 0.5 ? -1 : 1) * std::exp2(e(rng)));
      v[i] = in == DType::bf16 ? double(float(bf16(f))) : double(f);
      if (i % 1009 == 5) v[i] = NAN;
    }
    quantize_and_record(s, exact_input(s, v, shape, in), fp8, true);
  }});
}

void register_fp8_twins() {
  for (DType fp8 : {DType::f8e4m3, DType::f8e5m2}) every_bf16_case(fp8);
  // Odd sizes (one element per thread, partial tiles); GPT-2 124M's activation (4096 tokens x
  // 768) and MLP weight (3072 x 768); 1.3B's MLP weight (8192 x 2048).
  for (const Shape& shape : {Shape{37, 45}, Shape{130, 66}, Shape{4096, 768}, Shape{3072, 768},
                             Shape{8192, 2048}}) {
    for (DType in : {DType::bf16, DType::f32})
      for (DType fp8 : {DType::f8e4m3, DType::f8e5m2}) {
        if (shape.numel() > 4000000 && (in != DType::bf16 || fp8 != DType::f8e4m3)) continue;
        wide_range_case(shape, in, fp8);
      }
  }
}

}  // namespace
FSDP_REGISTER_TWINS(register_fp8_twins)
}  // namespace fsdp::testing
