// LayerNorm and RMSNorm (kernels/cuda/norm.h) against the CPU: forward and backward in bf16
// and f32, the fused residual add + norm, an f32 residual stream beside bf16 weights, at
// GPT-2 124M, GPT 1.3B and Llama widths, at odd widths (the scalar path) and at widths past
// what the register-resident backward holds.
#include <algorithm>

#include "kernels/ops.h"
#include "runtime/core/error.h"
#include "tests/kernels/twin_harness.h"

namespace fsdp::testing {
namespace {

// Activations and their gradients, relative to their scale: a bf16 output carries one
// rounding (2^-9) on top of f32 arithmetic, so 5e-3; f32 outputs differ by f32 rounding and
// summation order over one row: 1e-5.
Tolerance activation_tolerance(DType dt) {
  return dt == DType::bf16 ? Tolerance::scaled(5e-3, "one bf16 rounding of the output")
                           : Tolerance::scaled(1e-5, "f32 rounding and summation order");
}
// mean and rstd are f32 on both sides, each a sum over one row.
const Tolerance kStatistics = Tolerance::scaled(1e-5, "f32 statistics of one row on both sides");
// Weight and bias gradients are f32 sums over every row, in another order on each side.
const Tolerance kParamGrad = Tolerance::scaled(2e-5, "f32 sums over all rows, in another order");

bool same_bits(const TwinSide& s, const Tensor& a, const Tensor& b) {
  return s.values(a) == s.values(b);
}

void layernorm_case(int64_t rows, int64_t C, DType dt) {
  const std::string name = str_cat("layernorm ", rows, "x", C, " ", dtype_name(dt));
  register_twin({"norm", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const Tensor x = s.random(Shape{rows, C}, dt, 1, -3, 5);  // (N, C), mean far from 0
    const Tensor w = s.random(Shape{C}, dt, 2, 0.5, 1.5);
    const Tensor b = s.random(Shape{C}, dt, 3);
    const Tensor out = s.empty(Shape{rows, C}, dt);
    const Tensor mean = s.empty(Shape{rows}, DType::f32), rstd = s.empty(Shape{rows}, DType::f32);
    ops::layernorm_forward(ctx, out, mean, rstd, x, w, b, 1e-5);
    s.output("out", out, activation_tolerance(dt));
    s.output("mean", mean, kStatistics);
    s.output("rstd", rstd, kStatistics);

    const Tensor dout = s.random(Shape{rows, C}, dt, 4);
    const Tensor dx = s.random(Shape{rows, C}, dt, 5);  // the stream's gradient, accumulated
    const Tensor dw = s.full(Shape{C}, DType::f32, 0.5), db = s.full(Shape{C}, DType::f32, -0.5);
    // Each side reads the statistics it saved.
    ops::layernorm_backward(ctx, dx, dw, db, dout, x, w, mean, rstd, true, true);
    s.output("dx", dx, activation_tolerance(dt));
    s.output("dweight", dw, kParamGrad);
    s.output("dbias", db, kParamGrad);
    // Same inputs, same bits: the weight gradients are deterministic.
    const Tensor dw2 = s.full(Shape{C}, DType::f32, 0.5), db2 = s.full(Shape{C}, DType::f32, -0.5);
    ops::layernorm_backward(ctx, Tensor(), dw2, db2, dout, x, w, mean, rstd, false, true);
    s.expect(same_bits(s, dw2, dw), "dweight has the same bits when run again");
    s.expect(same_bits(s, db2, db), "dbias has the same bits when run again");
  }});
}

// The residual add fused into the norm: sum = x + residual stored in the stream's dtype and
// normalized. `stream` is the residual stream's dtype (dt, or f32 beside bf16 weights).
void add_norm_case(int64_t rows, int64_t C, DType dt, DType stream) {
  const std::string name =
      str_cat("add+norm ", rows, "x", C, " ", dtype_name(dt), " stream ", dtype_name(stream));
  register_twin({"norm", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const Shape shape{rows, C};  // (N, C)
    const Tensor x = ops::cast(ctx, s.random(shape, dt, 21, -3, 5), s.dtype(stream));
    const Tensor r = s.random(shape, dt, 22);
    const Tensor w = s.random(Shape{C}, dt, 23, 0.5, 1.5);
    const Tensor b = s.random(Shape{C}, dt, 24);
    const Tensor sum = s.empty(shape, stream), out = s.empty(shape, dt);
    const Tensor mean = s.empty(Shape{rows}, DType::f32), rstd = s.empty(Shape{rows}, DType::f32);
    ops::add_layernorm_forward(ctx, sum, out, mean, rstd, x, r, w, b, 1e-5);
    // An f32 stream sums two bf16 values in f32 on both sides: nothing rounds differently.
    s.output("sum", sum, activation_tolerance(stream));
    s.output("out", out, activation_tolerance(dt));

    // The unfused kernels: the add, then the norm of the sum as the stream stores it. A bf16
    // stream rounds the sum before it is normalized; the CPU reference's sum is f32, so the
    // statistics are compared on the rounded sum (CUDA's add and its rounding are the same
    // on both: sum and `stored` have equal values on the device).
    const Tensor added = s.empty(shape, stream);
    ops::add(ctx, added, x, r);
    const Tensor stored = s.rounded(added, stream);
    const Tensor out2 = s.empty(shape, dt);
    const Tensor mean2 = s.empty(Shape{rows}, DType::f32), rstd2 = s.empty(Shape{rows}, DType::f32);
    ops::layernorm_forward(ctx, out2, mean2, rstd2, stored, w, b, 1e-5);
    s.output("mean", mean2, kStatistics);
    s.output("rstd", rstd2, kStatistics);
    const Tensor rsum = s.empty(shape, stream), rout = s.empty(shape, dt);
    const Tensor rrstd = s.empty(Shape{rows}, DType::f32);
    ops::add_rmsnorm_forward(ctx, rsum, rout, rrstd, x, r, w, 1e-6);
    s.output("rms out", rout, activation_tolerance(dt));
    const Tensor rout2 = s.empty(shape, dt), rrstd2 = s.empty(Shape{rows}, DType::f32);
    ops::rmsnorm_forward(ctx, rout2, rrstd2, stored, w, 1e-6);
    s.output("rms rstd", rrstd2, kStatistics);
    // CUDA's fused kernels give the unfused kernels' bits. (Not asked of the CPU reference:
    // with a bf16 stream its fused sum is the unrounded f32 one.)
    if (!s.is_reference()) {
      s.expect(same_bits(s, added, sum), "fused add: the sum ops::add stores");
      s.expect(same_bits(s, out2, out), "fused layernorm: the unfused output");
      s.expect(same_bits(s, mean2, mean), "fused layernorm: the unfused mean");
      s.expect(same_bits(s, rstd2, rstd), "fused layernorm: the unfused rstd");
      s.expect(same_bits(s, rsum, added), "fused rmsnorm add: the sum ops::add stores");
      s.expect(same_bits(s, rout2, rout), "fused rmsnorm: the unfused output");
      s.expect(same_bits(s, rrstd2, rrstd), "fused rmsnorm: the unfused rstd");
    }

    // Backward with an addend equals accumulating into a copy of it, bit for bit, and
    // leaves the addend unchanged.
    const Tensor dout = s.random(shape, dt, 25);
    const Tensor addend = ops::cast(ctx, s.random(shape, dt, 26), s.dtype(stream));
    const Tensor before = ops::clone(ctx, addend);
    const Tensor acc = ops::clone(ctx, addend), dx = s.empty(shape, stream);
    const Tensor dw = ops::zeros(ctx, Shape{C}, DType::f32);
    const Tensor db = ops::zeros(ctx, Shape{C}, DType::f32);
    ops::layernorm_backward(ctx, acc, dw, db, dout, stored, w, mean2, rstd2, true, true);
    ops::layernorm_backward(ctx, dx, dw, db, dout, stored, w, mean2, rstd2, false, true, addend);
    s.expect(same_bits(s, dx, acc), "layernorm dx with an addend: accumulating into a copy's bits");
    s.expect(same_bits(s, addend, before), "layernorm leaves the addend unchanged");
    const Tensor racc = ops::clone(ctx, addend), rdx = s.empty(shape, stream);
    ops::rmsnorm_backward(ctx, racc, dw, dout, stored, w, rrstd2, true, true);
    ops::rmsnorm_backward(ctx, rdx, dw, dout, stored, w, rrstd2, false, true, addend);
    s.expect(same_bits(s, rdx, racc), "rmsnorm dx with an addend: accumulating into a copy's bits");
  }});
}

void rmsnorm_case(int64_t rows, int64_t C, DType dt) {
  const std::string name = str_cat("rmsnorm ", rows, "x", C, " ", dtype_name(dt));
  register_twin({"norm", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const Tensor x = s.random(Shape{rows, C}, dt, 6, -2, 2);  // (N, C)
    const Tensor w = s.random(Shape{C}, dt, 7, 0.5, 1.5);
    const Tensor out = s.empty(Shape{rows, C}, dt), rstd = s.empty(Shape{rows}, DType::f32);
    ops::rmsnorm_forward(ctx, out, rstd, x, w, 1e-6);
    s.output("out", out, activation_tolerance(dt));
    s.output("rstd", rstd, kStatistics);
    const Tensor dout = s.random(Shape{rows, C}, dt, 8);
    const Tensor dx = s.empty(Shape{rows, C}, dt);
    const Tensor dw = s.empty(Shape{C}, dt);  // bf16 parameter gradients too
    ops::rmsnorm_backward(ctx, dx, dw, dout, x, w, rstd, false, false);
    s.output("dx", dx, activation_tolerance(dt));
    s.output("dweight", dw,
             dt == DType::bf16 ? Tolerance::scaled(5e-3, "one bf16 rounding of the f32 sum")
                               : kParamGrad);
  }});
}

// An f32 residual stream (x, dx) beside bf16 weights: the output is bf16, the statistics
// and the stream's gradient f32.
void f32_stream_case(int64_t rows, int64_t C) {
  const std::string name = str_cat("norms ", rows, "x", C, " f32 stream bf16 weights");
  register_twin({"norm", name, [=](TwinSide& s) {
    Context& ctx = s.ctx();
    const DType bf = DType::bf16, f32 = DType::f32;
    const Tensor x = s.random(Shape{rows, C}, f32, 21, -3, 5);  // (N, C) the f32 stream
    const Tensor w = s.random(Shape{C}, bf, 22, 0.5, 1.5);
    const Tensor b = s.random(Shape{C}, bf, 23);
    const Tensor out = s.empty(Shape{rows, C}, bf);
    const Tensor mean = s.empty(Shape{rows}, f32), rstd = s.empty(Shape{rows}, f32);
    ops::layernorm_forward(ctx, out, mean, rstd, x, w, b, 1e-5);
    s.output("out", out, activation_tolerance(bf));
    s.output("mean", mean, Tolerance::scaled(1e-5, "f32 statistics of the unrounded f32 stream"));
    s.output("rstd", rstd, Tolerance::scaled(1e-5, "f32 statistics of the unrounded f32 stream"));
    const Tensor dout = s.random(Shape{rows, C}, bf, 24);
    const Tensor dx = s.random(Shape{rows, C}, f32, 25);  // accumulated in f32
    const Tensor dw = s.full(Shape{C}, f32, 0.5), db = s.full(Shape{C}, f32, -0.5);
    ops::layernorm_backward(ctx, dx, dw, db, dout, x, w, mean, rstd, true, true);
    s.output("dx", dx, Tolerance::scaled(1e-5, "f32 on both sides: no bf16 rounding of dx"));
    s.output("dweight", dw, kParamGrad);
    s.output("dbias", db, kParamGrad);

    const Tensor rout = s.empty(Shape{rows, C}, bf);
    ops::rmsnorm_forward(ctx, rout, rstd, x, w, 1e-6);
    s.output("rms out", rout, activation_tolerance(bf));
    const Tensor rdx = s.empty(Shape{rows, C}, f32), rdw = s.full(Shape{C}, f32, 0.0);
    ops::rmsnorm_backward(ctx, rdx, rdw, dout, x, w, rstd, false, true);
    s.output("rms dx", rdx, Tolerance::scaled(1e-5, "f32 on both sides: no bf16 rounding of dx"));
    s.output("rms dweight", rdw, kParamGrad);
  }});
}

void register_norm_twins() {
  // GPT-2: 4096 rows of 768 (packed loads); 300 rows of 100 channels (the scalar path).
  for (DType dt : {DType::bf16, DType::f32}) {
    layernorm_case(4096, 768, dt);
    layernorm_case(300, 100, dt);
  }
  // GPT-2 and GPT 1.3B widths (packed loads), 100 channels (scalar path); streams of the
  // compute dtype, and an f32 stream beside bf16 weights.
  add_norm_case(4096, 768, DType::bf16, DType::bf16);
  add_norm_case(512, 2048, DType::bf16, DType::f32);
  add_norm_case(300, 100, DType::f32, DType::f32);
  add_norm_case(300, 100, DType::bf16, DType::bf16);
  // Llama: the backward holds up to 4096 channels in registers at 8 per thread, up to 8192
  // at 16 per thread; 72 channels the scalar path.
  for (DType dt : {DType::bf16, DType::f32}) {
    rmsnorm_case(1024, 2048, dt);  // the forward's row in registers (bf16), or not (f32)
    rmsnorm_case(1024, 4096, dt);
    rmsnorm_case(64, 8192, dt);
    rmsnorm_case(33, 72, dt);
  }
  // Rows wider than registers hold: the shared-memory backward (one warp's sums need the
  // larger shared-memory opt-in); an odd width of 16 scalars per thread.
  rmsnorm_case(16, 16384, DType::bf16);
  layernorm_case(24, 12288, DType::bf16);
  layernorm_case(40, 5001, DType::f32);
  // GPT-2 width (8-wide packs: two 128-bit f32 loads per bf16 pack) and an odd width.
  f32_stream_case(4096, 768);
  f32_stream_case(300, 100);
}

}  // namespace
FSDP_REGISTER_TWINS(register_norm_twins)
}  // namespace fsdp::testing
