// FP8 row-wise quantization (kernels/cuda/fp8_rows.cu) and row-scaled FP8 matmuls
// (cuBLASLt's OUTER_VEC_32F scale mode, kernels/cuda/matmul.cu) against the CPU reference
// (kernels/cpu/fp8.cc). The amaxes and the quantization must give the same bits (the same
// maxima, one IEEE division and reciprocal, the same rounding); the matmuls are compared as
// products of the same FP8 bytes and scales, which also checks cuBLASLt's reading of the
// scale vectors: a vector read along the other dimension would scale rows by other rows'
// scales, far outside the tolerance (the rows of a and b have different magnitudes).
#include "kernels/ops.h"
#include "tests/kernels/twin_harness.h"

namespace fsdp::testing {
namespace {

using ops::Fp8Format;

// x (R, C) with rows and columns of different magnitudes: element (r, c) scaled by
// (1 + r % 7) (1 + c % 5).
Tensor uneven(TwinSide& s, int64_t rows, int64_t cols, DType dt, uint32_t seed) {
  Context& ctx = s.ctx();
  const Tensor x = s.random(Shape{rows, cols}, DType::f32, seed, -1, 1);
  std::vector<double> f(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) f[size_t(r * cols + c)] = double((1 + r % 7) * (1 + c % 5));
  const Tensor scaled = ctx.empty(Shape{rows, cols}, DType::f32);
  ops::mul(ctx, scaled, x, ops::from_vector(ctx, f, Shape{rows, cols}, DType::f32));
  return s.rounded(scaled, dt);  // held as dt on CUDA, rounded to dt in f32 on the CPU
}

void quantize_case(int64_t rows, int64_t cols, DType dt, Fp8Format format, bool sums) {
  const std::string name = str_cat("quantize rowwise ", rows, "x", cols, " ", dtype_name(dt), " ",
                                   kernels::fp8_format_name(format), sums ? " with bias gradient" : "");
  register_twin({"fp8_rows", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const Tensor x = uneven(s, rows, cols, dt, 101);  // (R, C)
    const Tensor db = sums ? s.random(Shape{cols}, DType::f32, 102) : Tensor();  // (C), added to
    const Tensor row_amax = s.empty(Shape{rows}, DType::f32), column_amax = s.empty(Shape{cols}, DType::f32);
    ops::fp8_row_amax(ctx, row_amax, x);
    ops::fp8_column_amax(ctx, column_amax, x);
    const ops::Fp8Quantized q = ops::fp8_quantize_rowwise(ctx, x, format, row_amax, column_amax, db);
    const Tolerance same = Tolerance::exact("maxima of the same values");
    const Tolerance same_bytes = Tolerance::exact("the same rounding of the same products");
    const Tolerance same_scales = Tolerance::exact("one division, one reciprocal");
    s.output("row amax", row_amax, same);
    s.output("column amax", column_amax, same);
    s.output("rows", q.rows.data, same_bytes);
    s.output("row scales", q.rows.scale_inv, same_scales);
    s.output("columns", q.columns.data, same_bytes);
    s.output("column scales", q.columns.scale_inv, same_scales);
    if (sums) s.output("bias gradient", db, Tolerance::scaled(1e-5, "f32 sums in tiles of 64 rows against double"));
  }});
}

// Relative to the output's scale: both sides multiply the same FP8 values; cuBLASLt keeps
// the FP8 MMA's partial sums (about 14 mantissa bits, as fp8_twins.cc measured for the
// tensor-wise products) and scales the f32 result by the two vectors; a bf16 output adds
// one rounding of 2^-9.
Tolerance row_product_tolerance(DType out) {
  if (out == DType::bf16) return Tolerance::scaled(5e-3, "one bf16 rounding of the output");
  return Tolerance::scaled(1e-3, "FP8 MMA partial sums keep ~14 bits");
}

void matmul_case(int64_t m, int64_t n, int64_t k, DType out_dtype, Fp8Format fa, bool bias,
                 ops::Epilogue epilogue, double beta) {
  const char* ep = epilogue == ops::Epilogue::Gelu    ? " gelu"
                   : epilogue == ops::Epilogue::DGelu ? " dgelu"
                                                      : "";
  const std::string name = str_cat("matmul rowwise ", m, "x", n, "x", k, " ",
                                   kernels::fp8_format_name(fa), " x e4m3 -> ", dtype_name(out_dtype),
                                   bias ? " bias" : "", ep, beta != 0.0 ? " accumulate" : "");
  register_twin({"fp8_rows", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    auto rowwise = [&](const Tensor& t, Fp8Format f) {
      const Tensor amax = s.empty(Shape{t.size(0)}, DType::f32);
      ops::fp8_row_amax(ctx, amax, t);
      return ops::fp8_quantize_rowwise(ctx, t, f, amax, Tensor()).rows;
    };
    const ops::Fp8Matrix qa = rowwise(uneven(s, m, k, DType::bf16, 103), fa);           // (M, K)
    const ops::Fp8Matrix qb = rowwise(uneven(s, n, k, DType::bf16, 104), Fp8Format::e4m3);  // (N, K)
    const Tensor out = beta != 0.0 ? s.random(Shape{m, n}, out_dtype, 105) : s.empty(Shape{m, n}, out_dtype);
    const Tensor b = bias ? s.random(Shape{n}, out_dtype, 106) : Tensor();
    Tensor aux;
    if (epilogue == ops::Epilogue::Gelu) aux = s.empty(Shape{m, n}, out_dtype);
    if (epilogue == ops::Epilogue::DGelu) aux = s.random(Shape{m, n}, out_dtype, 107, -3, 3);
    ops::fp8_matmul(ctx, out, qa, qb, 1.0, beta, b, epilogue, aux);
    s.output("out", out, row_product_tolerance(out_dtype));
    if (epilogue == ops::Epilogue::Gelu) s.output("pre-activation", aux, row_product_tolerance(out_dtype));
  }});
}

void register_fp8_rows_twins() {
  quantize_case(512, 768, DType::bf16, Fp8Format::e4m3, false);
  quantize_case(1000, 768, DType::bf16, Fp8Format::e5m2, true);  // a partial row tile
  quantize_case(100, 77, DType::bf16, Fp8Format::e4m3, true);    // partial tiles, padded vectors
  quantize_case(192, 320, DType::f32, Fp8Format::e4m3, false);
  quantize_case(128, 256, DType::f16, Fp8Format::e5m2, false);
  // The rowwise recipe's products of a GPT-2 layer (d 768, 512 tokens): the forward with
  // bias and with GELU; dgrad (e5m2 gradients) with GELU's gradient; wgrad (K = the tokens)
  // into an accumulating f32 gradient; and K a multiple of 16 only.
  matmul_case(512, 2304, 768, DType::bf16, Fp8Format::e4m3, true, ops::Epilogue::None, 0.0);
  matmul_case(512, 3072, 768, DType::bf16, Fp8Format::e4m3, true, ops::Epilogue::Gelu, 0.0);
  matmul_case(512, 768, 3072, DType::bf16, Fp8Format::e5m2, false, ops::Epilogue::DGelu, 0.0);
  matmul_case(768, 3072, 512, DType::f32, Fp8Format::e5m2, false, ops::Epilogue::None, 1.0);
  matmul_case(256, 384, 80, DType::f32, Fp8Format::e4m3, false, ops::Epilogue::None, 0.0);
}
FSDP_REGISTER_TWINS(register_fp8_rows_twins)

}  // namespace
}  // namespace fsdp::testing
