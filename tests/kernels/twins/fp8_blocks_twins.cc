// FP8 block-wise quantization (kernels/cuda/fp8_blocks.cu) and block-scaled FP8 matmuls
// (cuBLASLt's VEC128_32F and BLK128x128_32F scale modes, kernels/cuda/matmul.cu) against the
// CPU reference (kernels/cpu/fp8.cc). Quantization must give the same bytes and block scales
// bit for bit (the same amax of each block, one IEEE division and reciprocal, the same
// rounding); the matmuls are compared as products of the same FP8 bytes and scales. The
// matmul cases also check cuBLASLt's reading of the scale grids (kernels/fp8_format.h): a
// layout it reads otherwise would scale blocks by their neighbours' scales, far outside the
// tolerance. K = 768 and 640 give 128x128 grids whose rows are padded (6 and 5 blocks of K,
// rounded up to 8).
#include "kernels/ops.h"
#include "tests/kernels/twin_harness.h"

namespace fsdp::testing {
namespace {

using ops::Fp8Format;
using ops::Fp8Granularity;

void quantize_case(int64_t rows, int64_t cols, DType dt, Fp8Format format, Fp8Granularity g,
                   bool sums) {
  const std::string name = str_cat("quantize ", kernels::fp8_granularity_name(g), " ", rows, "x",
                                   cols, " ", dtype_name(dt), " ", kernels::fp8_format_name(format),
                                   sums ? " with bias gradient" : "");
  register_twin({"fp8_blocks", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const Tensor x = s.random(Shape{rows, cols}, dt, 91, -3, 3);  // (R, C)
    const Tensor db = sums ? s.random(Shape{cols}, DType::f32, 92) : Tensor();  // (C), added to
    const ops::Fp8Quantized q = ops::fp8_quantize_blocks(ctx, x, format, g, true, true, db);
    const Tolerance same_bytes = Tolerance::exact("the same rounding of the same products");
    const Tolerance same_scales = Tolerance::exact("the same block amax, one division, one reciprocal");
    s.output("rows", q.rows.data, same_bytes);
    s.output("row scales", q.rows.scale_inv, same_scales);
    s.output("columns", q.columns.data, same_bytes);
    s.output("column scales", q.columns.scale_inv, same_scales);
    if (sums) s.output("bias gradient", db, Tolerance::scaled(1e-5, "f32 sums in tiles of 128 rows against double"));
    if (g == Fp8Granularity::block_128x128) {
      // The same blocks both ways: the columns are the rows transposed.
      const std::vector<double> r = s.values(q.rows.data), c = s.values(q.columns.data);
      bool same = true;
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) same = same && r[size_t(i * cols + j)] == c[size_t(j * rows + i)];
      s.expect(same, "128x128 columns are the transpose of the rows");
    }
  }});
}

struct Variant {
  DType out = DType::bf16;
  Fp8Format fa = Fp8Format::e4m3, fb = Fp8Format::e4m3;
  Fp8Granularity ga = Fp8Granularity::block_1x128, gb = Fp8Granularity::block_128x128;
  bool bias = false;
  ops::Epilogue epilogue = ops::Epilogue::None;
  double beta = 0.0;
};

// Relative to the output's scale. Both sides multiply the same FP8 values; cuBLASLt sums
// each block of 128 of K in the FP8 MMA's accumulator (about 14 mantissa bits, as for the
// tensor-wise products of fp8_twins.cc, which measured 1.9e-4 to 2.3e-4 of the scale on the
// H200) and promotes it, scaled, to f32; the reference sums the dequantized values in f32.
// A bf16 output adds one rounding of 2^-9.
Tolerance block_product_tolerance(DType out) {
  if (out == DType::bf16) return Tolerance::scaled(5e-3, "one bf16 rounding of the output");
  return Tolerance::scaled(1e-3, "FP8 MMA partial sums keep ~14 bits before each block's f32 promotion");
}

void matmul_case(int64_t m, int64_t n, int64_t k, const Variant& v) {
  const char* ep = v.epilogue == ops::Epilogue::Gelu    ? " gelu"
                   : v.epilogue == ops::Epilogue::DGelu ? " dgelu"
                                                        : "";
  const std::string name = str_cat(
      "matmul ", m, "x", n, "x", k, " ", kernels::fp8_format_name(v.fa), " ",
      kernels::fp8_granularity_name(v.ga), " x ", kernels::fp8_format_name(v.fb), " ",
      kernels::fp8_granularity_name(v.gb), " -> ", dtype_name(v.out), v.bias ? " bias" : "", ep,
      v.beta != 0.0 ? " accumulate" : "");
  register_twin({"fp8_blocks", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    // Rows of different magnitudes, so that neighbouring blocks have different scales.
    const Tensor a = s.random(Shape{m, k}, DType::bf16, 93, -4, 4);      // (M, K)
    const Tensor b = s.random(Shape{n, k}, DType::bf16, 94, -0.2, 0.2);  // (N, K)
    const ops::Fp8Matrix qa = ops::fp8_quantize_blocks(ctx, a, v.fa, v.ga, true, false).rows;
    const ops::Fp8Matrix qb = ops::fp8_quantize_blocks(ctx, b, v.fb, v.gb, true, false).rows;
    const Tensor out = v.beta != 0.0 ? s.random(Shape{m, n}, v.out, 95) : s.empty(Shape{m, n}, v.out);
    const Tensor bias = v.bias ? s.random(Shape{n}, v.out, 96) : Tensor();
    Tensor aux;
    if (v.epilogue == ops::Epilogue::Gelu) aux = s.empty(Shape{m, n}, v.out);
    if (v.epilogue == ops::Epilogue::DGelu) aux = s.random(Shape{m, n}, v.out, 97, -3, 3);
    ops::fp8_matmul(ctx, out, qa, qb, 1.0, v.beta, bias, v.epilogue, aux);
    s.output("out", out, block_product_tolerance(v.out));
    if (v.epilogue == ops::Epilogue::Gelu) s.output("pre-activation", aux, block_product_tolerance(v.out));
  }});
}

void register_fp8_blocks_twins() {
  using G = Fp8Granularity;
  // Activations and output gradients: 1x128 along the rows and along the columns.
  quantize_case(256, 768, DType::bf16, Fp8Format::e4m3, G::block_1x128, false);
  quantize_case(1000, 768, DType::bf16, Fp8Format::e5m2, G::block_1x128, true);  // a partial row tile
  quantize_case(100, 77, DType::bf16, Fp8Format::e4m3, G::block_1x128, true);    // partial tiles, padded grids
  quantize_case(192, 320, DType::f32, Fp8Format::e4m3, G::block_1x128, false);
  quantize_case(128, 256, DType::f16, Fp8Format::e5m2, G::block_1x128, false);
  // Weights: 128x128, the grid transposed for the columns.
  quantize_case(2304, 768, DType::bf16, Fp8Format::e4m3, G::block_128x128, false);  // padded rows of 6
  quantize_case(300, 200, DType::f32, Fp8Format::e4m3, G::block_128x128, false);    // partial blocks

  // The blockwise recipe's products of a GPT-2 layer (d 768, 512 tokens): the forward x (1x128)
  // by W (128x128), with bias and with GELU; dgrad dy (e5m2, 1x128) by W^T (128x128), with
  // GELU's gradient; wgrad dy^T by x^T (both 1x128, K = the tokens) into an f32 gradient.
  matmul_case(512, 2304, 768, {DType::bf16, Fp8Format::e4m3, Fp8Format::e4m3, G::block_1x128,
                               G::block_128x128, true});
  matmul_case(512, 3072, 768, {DType::bf16, Fp8Format::e4m3, Fp8Format::e4m3, G::block_1x128,
                               G::block_128x128, true, ops::Epilogue::Gelu});
  matmul_case(512, 768, 3072, {DType::bf16, Fp8Format::e5m2, Fp8Format::e4m3, G::block_1x128,
                               G::block_128x128});
  matmul_case(512, 768, 3072, {DType::bf16, Fp8Format::e5m2, Fp8Format::e4m3, G::block_1x128,
                               G::block_128x128, false, ops::Epilogue::DGelu});
  matmul_case(768, 3072, 512, {DType::f32, Fp8Format::e5m2, Fp8Format::e4m3, G::block_1x128,
                               G::block_1x128, false, ops::Epilogue::None, 1.0});
  matmul_case(768, 3072, 512, {DType::bf16, Fp8Format::e4m3, Fp8Format::e4m3, G::block_1x128,
                               G::block_1x128});
  // 128x128 on our a (cuBLASLt's B), 1x128 on our b: the other assignment of the modes.
  matmul_case(256, 384, 640, {DType::f32, Fp8Format::e4m3, Fp8Format::e4m3, G::block_128x128,
                              G::block_1x128});
}
FSDP_REGISTER_TWINS(register_fp8_blocks_twins)

}  // namespace
}  // namespace fsdp::testing
