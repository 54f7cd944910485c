// FP8 quantization (kernels/cuda/fp8.cu) and FP8 matmuls (cuBLASLt, kernels/cuda/matmul.cu)
// against the CPU reference (kernels/cpu/fp8.cc). Quantization must give the same bytes and
// scales bit for bit: the CPU's software rounding (kernels/fp8_format.h) is the twin of the
// hardware's satfinite conversion, in both formats, for normal, subnormal and saturated
// values. The matmuls are compared as products of the same FP8 bytes.
#include <cmath>

#include "kernels/ops.h"
#include "tests/kernels/twin_harness.h"
#include "tests/kernels/twins/timed_matmuls.h"

namespace fsdp::testing {
namespace {

using ops::Fp8Format;

// The amax a case quantizes with: measured from x, or a fixed value that puts most of x in
// the small binades and the subnormals (300 for |x| < 1: scale 448 / 300), or one that
// saturates most of it (0.05).
enum class AmaxFrom { measured, small_values, saturating };

void quantize_case(int64_t rows, int64_t cols, DType dt, Fp8Format format, AmaxFrom from) {
  const char* from_name = from == AmaxFrom::measured       ? "measured amax"
                          : from == AmaxFrom::small_values ? "small values"
                                                           : "saturating";
  const std::string name = str_cat("quantize ", rows, "x", cols, " ", dtype_name(dt), " ",
                                   kernels::fp8_format_name(format), " ", from_name);
  register_twin({"fp8", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const Tensor x = s.random(Shape{rows, cols}, dt, 41);  // (R, C)
    Tensor amax = s.empty(Shape{1}, DType::f32);
    ops::fp8_amax(ctx, amax, x);
    s.output("amax", amax, Tolerance::exact("a maximum of the same values"));
    if (from != AmaxFrom::measured)
      amax = s.full(Shape{1}, DType::f32, from == AmaxFrom::small_values ? 300.0 : 0.05);
    const ops::Fp8Quantized q = ops::fp8_quantize(ctx, x, amax, format, true, true);
    s.output("scale_inv", q.rows.scale_inv, Tolerance::exact("one IEEE division and reciprocal"));
    s.output("rows", q.rows.data, Tolerance::exact("the same rounding of the same products"));
    s.output("columns", q.columns.data, Tolerance::exact("the transpose of the same bytes"));
    // Every byte of the transposed copy is the byte of the row-major one.
    const std::vector<double> r = s.values(q.rows.data), c = s.values(q.columns.data);
    bool same = true;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) same = same && r[size_t(i * cols + j)] == c[size_t(j * rows + i)];
    s.expect(same, "columns is the transpose of rows");
  }});
}

// Relative to the output's scale. Both sides multiply the same FP8 values, exact in f32;
// they differ by accumulation order and, on Hopper, by the FP8 MMA's accumulator, which
// keeps about 14 mantissa bits (DeepSeek-V3's report measured it; cuBLASLt promotes the
// partial sums to f32 between chunks of K, and less often with fast accumulation): the
// H200 measured 1.9e-4 and 2.3e-4 of the scale for K = 512 into f32, hence 1e-3, not the
// 2e-5 of a bf16 product into f32. A bf16 output adds one rounding of 2^-9.
Tolerance fp8_product_tolerance(DType out, bool fast_accum) {
  if (out == DType::bf16) return Tolerance::scaled(5e-3, "one bf16 rounding of the output");
  return fast_accum ? Tolerance::scaled(2e-3, "fast accumulation: ~14-bit partial sums, promoted rarely")
                    : Tolerance::scaled(1e-3, "FP8 MMA partial sums keep ~14 bits between f32 promotions");
}

struct MatmulVariant {
  DType out = DType::bf16;
  Fp8Format fa = Fp8Format::e4m3, fb = Fp8Format::e4m3;
  bool bias = false;
  ops::Epilogue epilogue = ops::Epilogue::None;
  double beta = 0.0;
  bool fast_accum = false;
};

void matmul_case(int64_t m, int64_t n, int64_t k, const MatmulVariant& v) {
  const char* ep = v.epilogue == ops::Epilogue::Gelu    ? " gelu"
                   : v.epilogue == ops::Epilogue::DGelu ? " dgelu"
                                                        : "";
  const std::string name =
      str_cat("matmul ", m, "x", n, "x", k, " ", kernels::fp8_format_name(v.fa), "x",
              kernels::fp8_format_name(v.fb), "->", dtype_name(v.out), v.bias ? " bias" : "", ep,
              v.beta != 0.0 ? " accumulate" : "", v.fast_accum ? " fast" : "");
  register_twin({"fp8", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const Tensor a = s.random(Shape{m, k}, DType::bf16, 51);              // (M, K)
    const Tensor b = s.random(Shape{n, k}, DType::bf16, 52, -0.2, 0.2);   // (N, K)
    auto quantized = [&](const Tensor& t, Fp8Format f) {
      const Tensor amax = s.empty(Shape{1}, DType::f32);
      ops::fp8_amax(ctx, amax, t);
      return ops::fp8_quantize(ctx, t, amax, f, true, false).rows;
    };
    const ops::Fp8Matrix qa = quantized(a, v.fa), qb = quantized(b, v.fb);
    const Tensor out = v.beta != 0.0 ? s.random(Shape{m, n}, v.out, 53) : s.empty(Shape{m, n}, v.out);
    const Tensor bias = v.bias ? s.random(Shape{n}, v.out, 54) : Tensor();
    Tensor aux;
    if (v.epilogue == ops::Epilogue::Gelu) aux = s.empty(Shape{m, n}, v.out);
    if (v.epilogue == ops::Epilogue::DGelu) aux = s.random(Shape{m, n}, v.out, 55, -3, 3);
    ops::fp8_matmul(ctx, out, qa, qb, 1.0, v.beta, bias, v.epilogue, aux, v.fast_accum);
    s.output("out", out, fp8_product_tolerance(v.out, v.fast_accum));
    if (v.epilogue == ops::Epilogue::Gelu)
      s.output("pre-activation", aux, fp8_product_tolerance(v.out, v.fast_accum));
  }});
}

// FP8 products timed on their first call (MatmulTuning, as training runs them): each
// candidate runs with the device's alpha and beta, and an accumulating output is put back
// before the real call, so the results are the untimed ones' (a missed put-back would add
// the product once per timing run).
void timed_matmul_case() {
  register_twin({"fp8", "matmul timed on first call: forward, dgrad, accumulated wgrad", [](TwinSide& s) {
    Context& ctx = s.ctx();
    TimedMatmuls timed(s, true);
    auto quantized = [&](const Tensor& t, Fp8Format f) {
      const Tensor amax = s.empty(Shape{1}, DType::f32);
      ops::fp8_amax(ctx, amax, t);
      return ops::fp8_quantize(ctx, t, amax, f, true, false).rows;
    };
    const int64_t m = 512, n = 1536, k = 768;
    const ops::Fp8Matrix x = quantized(s.random(Shape{m, k}, DType::bf16, 81), Fp8Format::e4m3);
    const ops::Fp8Matrix w = quantized(s.random(Shape{n, k}, DType::bf16, 82, -0.2, 0.2), Fp8Format::e4m3);
    const ops::Fp8Matrix g = quantized(s.random(Shape{m, k}, DType::bf16, 83), Fp8Format::e5m2);
    const Tensor y = s.empty(Shape{m, n}, DType::bf16);
    ops::fp8_matmul(ctx, y, x, w, 1.0, 0.0, Tensor(), ops::Epilogue::None, Tensor(), true);
    s.output("forward", y, fp8_product_tolerance(DType::bf16, true));
    const Tensor dx = s.empty(Shape{m, n}, DType::bf16);
    ops::fp8_matmul(ctx, dx, g, w, 1.0, 0.0);
    s.output("dgrad", dx, fp8_product_tolerance(DType::bf16, false));
    const Tensor dw = s.random(Shape{m, n}, DType::f32, 84);  // accumulated into, twice
    for (int rep = 0; rep < 2; ++rep) ops::fp8_matmul(ctx, dw, g, w, 1.0, 1.0);
    s.output("wgrad accumulated", dw, fp8_product_tolerance(DType::f32, false));
    timed.check(s, 3);
  }});
}

// An output gradient quantized with its bias gradient read in the same pass: the sums
// (added to an existing gradient) against the CPU's, the bytes as without them.
void column_sums_case(int64_t rows, int64_t cols, DType grad) {
  const std::string name = str_cat("quantize with bias gradient ", rows, "x", cols, " -> ",
                                   dtype_name(grad));
  register_twin({"fp8", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const Tensor dy = s.random(Shape{rows, cols}, DType::bf16, 61);  // (N, out)
    const Tensor db = s.random(Shape{cols}, grad, 62);               // (out), accumulated into
    const Tensor amax = s.empty(Shape{1}, DType::f32);
    ops::fp8_amax(ctx, amax, dy);
    const ops::Fp8Quantized q = ops::fp8_quantize(ctx, dy, amax, Fp8Format::e5m2, true, true, db);
    s.output("bias gradient", db, Tolerance::scaled(1e-5, "f32 sums in tiles of 64 rows against double"));
    s.output("rows", q.rows.data, Tolerance::exact("the same rounding of the same products"));
    s.output("columns", q.columns.data, Tolerance::exact("the transpose of the same bytes"));
  }});
}

// Delayed scaling's quantization: scaled by a given amax, recording max |x| into a step amax
// that already holds `before` (kept when larger), with the bias gradient's sums or without.
void recording_case(int64_t rows, int64_t cols, double before, bool sums) {
  const std::string name = str_cat("quantize recording the amax ", rows, "x", cols, " over ", before,
                                   sums ? " with bias gradient" : "");
  register_twin({"fp8", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const Tensor x = s.random(Shape{rows, cols}, DType::bf16, 71, -3, 3);  // (R, C)
    const Tensor amax = s.full(Shape{1}, DType::f32, 2.5);  // an earlier step's: some saturate
    const Tensor record = s.full(Shape{1}, DType::f32, before);
    const Tensor db = sums ? s.random(Shape{cols}, DType::f32, 72) : Tensor();
    const ops::Fp8Quantized q =
        ops::fp8_quantize(ctx, x, amax, Fp8Format::e4m3, true, true, db, record);
    s.output("recorded amax", record, Tolerance::exact("a maximum of the same values"));
    s.output("rows", q.rows.data, Tolerance::exact("the same rounding of the same products"));
    s.output("columns", q.columns.data, Tolerance::exact("the transpose of the same bytes"));
    if (sums) s.output("bias gradient", db, Tolerance::scaled(1e-5, "f32 sums in tiles of 64 rows against double"));
  }});
}

// The casts that compute an FP8 MLP's operands from the activation's tensors as they read
// them: SwiGLU's output (proj's input, from x (N, 2F)), and the gradient at the activation's
// input (fc's output gradient, from dout (N, F) and x (N, F) for GELU, (N, 2F) for SwiGLU).
// On each side they must equal, bit for bit, the cast of what swiglu_forward, gelu_backward
// or swiglu_backward store. CUDA stores those values in bf16, so its cast rounds twice (to
// bf16, then to FP8); the reference holds them in f32 (TwinSide::dtype), and a single
// rounding from f32 lands on the other FP8 neighbour for 0.6-1.8% of the values (measured on
// an H100). So the reference's outputs are the cast of its values rounded to bf16 first, as
// CUDA's tensor holds them. With `scaled_by` > 0 the cast scales by that amax (delayed
// scaling) and records the values'.
void activation_case(ops::Fp8CastSource kind, int64_t rows, int64_t f, double scaled_by, bool sums) {
  using ops::Fp8CastSource;
  const bool gelu = kind == Fp8CastSource::gelu_grad, forward = kind == Fp8CastSource::swiglu;
  const int64_t x_cols = gelu ? f : 2 * f, cols = forward ? f : x_cols;  // x's, the values'
  const std::string name = str_cat(
      "quantize ", forward ? "SwiGLU's output " : gelu ? "the GELU gradient " : "the SwiGLU gradient ",
      rows, "x", cols, scaled_by > 0 ? str_cat(" scaled by ", scaled_by) : " measured",
      sums ? " with column sums" : "");
  register_twin({"fp8", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const Tensor dout = forward ? Tensor() : s.random(Shape{rows, f}, DType::bf16, 101);  // (N, F)
    const Tensor x = s.random(Shape{rows, x_cols}, DType::bf16, 102, -4, 4);  // the activation's input
    const Tensor db = sums ? s.random(Shape{cols}, DType::f32, 103) : Tensor();
    const Tensor db_stored = sums ? s.empty(Shape{cols}, DType::f32) : Tensor();
    if (sums) ops::copy(ctx, db_stored, db);
    const Tensor amax = s.empty(Shape{1}, DType::f32);
    ops::fp8_amax_activation(ctx, amax, kind, dout, x);
    const Tensor record = s.full(Shape{1}, DType::f32, 0.0), record_stored = s.full(Shape{1}, DType::f32, 0.0);
    const Tensor scale = scaled_by > 0 ? s.full(Shape{1}, DType::f32, scaled_by) : amax;
    const Fp8Format format = forward ? Fp8Format::e4m3 : Fp8Format::e5m2;
    const ops::Fp8Quantized q =
        ops::fp8_quantize_activation(ctx, kind, dout, x, scale, format, true, true, db, record);
    // The same from the stored values, on the same side.
    const Tensor v = s.empty(Shape{rows, cols}, DType::bf16);
    if (forward)
      ops::swiglu_forward(ctx, v, x);
    else if (gelu)
      ops::gelu_backward(ctx, v, dout, x);
    else
      ops::swiglu_backward(ctx, v, dout, x);
    const Tensor amax_stored = s.empty(Shape{1}, DType::f32);
    ops::fp8_amax(ctx, amax_stored, v);
    const ops::Fp8Quantized stored =
        ops::fp8_quantize(ctx, v, scale, format, true, true, db_stored, record_stored);
    s.expect(s.values(amax) == s.values(amax_stored), "the amax of the stored values");
    s.expect(s.values(q.rows.data) == s.values(stored.rows.data) &&
                 s.values(q.columns.data) == s.values(stored.columns.data),
             "the bytes of the stored values' cast");
    s.expect(s.values(record) == s.values(record_stored), "the recorded amax of the stored values");
    if (sums) s.expect(s.values(db) == s.values(db_stored), "the column sums of the stored values");
    // What is compared: CUDA's fused cast, and the reference's cast of its values rounded to
    // bf16 (on CUDA rounded() changes nothing, and the expectations above tie the fused cast
    // to it).
    const Tensor vb = s.rounded(v, DType::bf16);
    const Tensor amax_b = s.empty(Shape{1}, DType::f32);
    ops::fp8_amax(ctx, amax_b, vb);
    const Tensor record_b = s.full(Shape{1}, DType::f32, 0.0);
    const Tensor db_b = sums ? s.random(Shape{cols}, DType::f32, 103) : Tensor();
    const ops::Fp8Quantized qb = ops::fp8_quantize(ctx, vb, scaled_by > 0 ? scale : amax_b, format,
                                                   true, true, db_b, record_b);
    // The activation's f32 arithmetic (exp, tanh) differs by ulps between the two sides; where
    // that moves a value to the other bf16 neighbour its byte may move by one FP8 step.
    const Tolerance one_step = Tolerance::absolute(
        1.5, "values a bf16 neighbour apart: at most one FP8 step (adjacent bytes)");
    const Tolerance few = Tolerance::mismatched(
        1e-3, "f32 activations on both sides, rounded to bf16: rare neighbours, then their bytes");
    s.output("amax", amax_b, Tolerance::scaled(8e-3, "at most one bf16 neighbour of the maximum"));
    s.output("recorded amax", record_b, Tolerance::scaled(8e-3, "at most one bf16 neighbour of the maximum"));
    s.output("rows", qb.rows.data, one_step);
    s.output("rows that differ", qb.rows.data, few);
    s.output("columns", qb.columns.data, one_step);
    s.output("columns that differ", qb.columns.data, few);
    // A value one bf16 step apart moves its column's sum by that step: 2^-6 for a value in
    // [2, 4), 1.4e-4 of the sums' scale at 1000 x 1408 (measured on an H100, one such value).
    if (sums)
      s.output("column sums", db_b,
               Tolerance::scaled(1e-3, "f32 sums over rows of which a few values are one bf16 step apart"));
  }});
}

// The histories' update after a step: every layer's operands rolled (or not), the scale
// amaxes by "max" or "most_recent", times a margin.
void histories_case(bool roll, bool use_max, int margin) {
  const std::string name = str_cat("amax histories ", roll ? "after a step" : "after a load",
                                   use_max ? " max" : " most_recent", " margin ", margin);
  register_twin({"fp8", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const Tensor history = s.random(Shape{7, 16, 3}, DType::f32, 81, 0, 4);  // (layers, len, 3)
    const Tensor step = s.random(Shape{7, 3}, DType::f32, 82, 0, 8);
    const Tensor scale_amax = s.empty(Shape{7, 3}, DType::f32);
    ops::fp8_update_amax_histories(ctx, history, step, scale_amax, roll, use_max,
                                   float(1 << margin));
    s.output("history", history, Tolerance::exact("values moved, not computed"));
    s.output("scale amax", scale_amax, Tolerance::exact("a maximum times a power of two"));
  }});
}

// fp8_param's weight shards: a flat piece quantized elementwise (rows of 4096 and a
// remainder on the GPU, at an offset that is not a multiple of the rows), and the inverse
// scales of several amaxes (zero and infinite ones among them: scale 1).
void flat_case(int64_t n, int64_t offset, Fp8Format format) {
  const std::string name = str_cat("quantize flat ", n, " at ", offset, " ",
                                   kernels::fp8_format_name(format), " and scale inverses");
  register_twin({"fp8", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const Tensor whole = s.random(Shape{offset + n}, DType::bf16, 91, -2, 2);
    const Tensor x = whole.narrow(0, offset, n);
    const Tensor amax = s.full(Shape{1}, DType::f32, 1.5);  // some values saturate
    const Tensor q = s.empty(Shape{n}, DType::u8);
    ops::fp8_quantize_flat(ctx, q, x, amax, format);
    s.output("bytes", q, Tolerance::exact("the same rounding of the same products"));
    const Tensor amaxes = s.random(Shape{37}, DType::f32, 92, 0, 100);
    ops::fill(ctx, amaxes.narrow(0, 3, 1), 0.0);
    ops::fill(ctx, amaxes.narrow(0, 5, 1), INFINITY);
    const Tensor inverses = s.empty(Shape{37}, DType::f32);
    ops::fp8_scale_inverses(ctx, inverses, amaxes, format);
    s.output("scale inverses", inverses, Tolerance::exact("one IEEE division and reciprocal"));
  }});
}

void register_fp8_twins() {
  flat_case(3 * 4096 + 1000, 128, Fp8Format::e4m3);
  flat_case(700, 8, Fp8Format::e5m2);
  recording_case(1000, 768, 0.0, false);
  recording_case(100, 77, 0.0, true);   // partial tiles, byte-wise stores
  recording_case(256, 768, 50.0, true); // the earlier maximum stays
  for (bool roll : {true, false})
    for (bool use_max : {true, false}) histories_case(roll, use_max, roll ? 0 : 3);
  using ops::Fp8CastSource;
  activation_case(Fp8CastSource::gelu_grad, 1000, 768, 0.0, true);    // a partial last row tile
  activation_case(Fp8CastSource::gelu_grad, 256, 3072, 0.5, false);   // delayed: some saturate
  activation_case(Fp8CastSource::gelu_grad, 100, 77, 0.0, true);      // byte-wise, partial tiles
  activation_case(Fp8CastSource::swiglu_grad, 1000, 704, 0.0, true);  // F not a multiple of 128
  // Without column sums the CUDA cast reads each (gate, up) pair once: partial tiles.
  activation_case(Fp8CastSource::swiglu_grad, 1000, 704, 0.0, false);
  activation_case(Fp8CastSource::swiglu_grad, 100, 200, 0.0, false);  // rows % 8 != 0: byte-wise qt
  activation_case(Fp8CastSource::swiglu_grad, 256, 1024, 0.5, false);
  activation_case(Fp8CastSource::swiglu_grad, 100, 36, 0.0, true);    // F not a multiple of 8
  activation_case(Fp8CastSource::swiglu, 1000, 704, 0.0, false);
  activation_case(Fp8CastSource::swiglu, 256, 1024, 2.0, true);
  activation_case(Fp8CastSource::swiglu, 100, 36, 0.0, false);
  column_sums_case(1000, 768, DType::f32);  // a partial last row tile
  column_sums_case(256, 100, DType::f32);   // a partial column tile, byte-wise stores
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2})
    for (AmaxFrom from : {AmaxFrom::measured, AmaxFrom::small_values, AmaxFrom::saturating}) {
      quantize_case(256, 768, DType::bf16, f, from);
      quantize_case(100, 77, DType::bf16, f, from);  // partial tiles, byte-wise stores
    }
  quantize_case(192, 320, DType::f32, Fp8Format::e4m3, AmaxFrom::measured);
  quantize_case(100, 96, DType::bf16, Fp8Format::e4m3, AmaxFrom::measured);  // 8-wide rows only
  quantize_case(72, 200, DType::bf16, Fp8Format::e5m2, AmaxFrom::measured);  // (8, 8) blocks, partial tiles

  matmul_case(256, 768, 512, {});
  matmul_case(256, 768, 512, {DType::bf16, Fp8Format::e4m3, Fp8Format::e4m3, false,
                              ops::Epilogue::None, 0.0, true});
  matmul_case(512, 2304, 768, {DType::bf16, Fp8Format::e4m3, Fp8Format::e4m3, true});
  matmul_case(512, 3072, 768, {DType::bf16, Fp8Format::e4m3, Fp8Format::e4m3, true,
                               ops::Epilogue::Gelu});
  matmul_case(512, 768, 3072, {DType::bf16, Fp8Format::e5m2, Fp8Format::e4m3, false,
                               ops::Epilogue::DGelu});
  matmul_case(512, 768, 3072, {DType::bf16, Fp8Format::e5m2, Fp8Format::e4m3});  // dgrad
  matmul_case(768, 3072, 512, {DType::f32, Fp8Format::e5m2, Fp8Format::e4m3, false,
                               ops::Epilogue::None, 1.0});  // wgrad into an f32 gradient
  matmul_case(768, 3072, 512, {DType::f32, Fp8Format::e4m3, Fp8Format::e4m3, false,
                               ops::Epilogue::None, 1.0});
  timed_matmul_case();
}
FSDP_REGISTER_TWINS(register_fp8_twins)

}  // namespace
}  // namespace fsdp::testing
