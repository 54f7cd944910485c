// The transformer MLP as one differentiable op (nn::mlp, functional.h).
//
// One node for the whole MLP lets backward (1) recompute the activation from its saved input
// instead of keeping it (the "selective" activation recompute: F values per token fewer for
// one elementwise pass; before an FP8 proj its one-byte FP8 copy is kept instead), and (2)
// fuse GELU's gradient into the matmul that produces the gradient at its output
// (Epilogue::DGelu), so it is never written and read back.
#include <optional>

#include "kernels/ops.h"
#include "runtime/nn/dense_product.h"
#include "runtime/nn/fp8_linear.h"
#include "runtime/nn/functional.h"
#include "runtime/nn/op_support.h"

namespace fsdp::nn {

using detail::rows;
using detail::with_last;

void detail::mlp_activation(Context& ctx, MlpActivation act, const Tensor& out, const Tensor& h) {
  if (act == MlpActivation::Gelu)
    ops::gelu_forward(ctx, out, h);
  else
    ops::swiglu_forward(ctx, out, h);
}

// (Over 80 lines on purpose: an op's forward and the backward closure it records are one
// function, so the tensors the forward saves and the backward reads stay in one view.)
Tensor mlp(Graph& g, const Tensor& x, Parameter& fc_weight, Parameter* fc_bias,
           Parameter& proj_weight, Parameter* proj_bias, MlpActivation activation,
           bool recompute_activation, const ColumnParallelInput& column) {
  Context& ctx = g.ctx();
  // Weights gathered in FP8 have only their FP8 bytes (fp8::applies): shapes from the specs.
  const Shape& w_fc = fc_weight.shape();      // (F or 2F, C)
  const Shape& w_proj = proj_weight.shape();  // (C, F)
  FSDP_CHECK(w_fc.rank() == 2 && w_proj.rank() == 2, ShapeError, "mlp ", fc_weight.name(), ": ",
             w_fc, " and ", w_proj, " are not both 2-D");
  const int64_t c = w_fc[1], h_f = w_fc[0], f = w_proj[1];
  const bool gelu = activation == MlpActivation::Gelu;
  FSDP_CHECK(x.dim() >= 1 && x.size(-1) == c, ShapeError, "mlp ", fc_weight.name(), ": input ",
             x.str(), " does not end in ", c, " features");
  FSDP_CHECK(w_proj[0] == c && h_f == (gelu ? f : 2 * f), ShapeError, "mlp: ",
             fc_weight.name(), " ", w_fc, " and ", proj_weight.name(), " ", w_proj,
             " do not fit a ", gelu ? "GELU" : "SwiGLU", " MLP");
  detail::check_compute_dtype(x, fc_weight, "mlp");
  const detail::ProductInput in = detail::product_input(ctx, x, column, c, "mlp", fc_weight);
  const bool gathered = in.gathered;
  const Tensor& whole = in.whole;  // (..., C)
  const Tensor& x2 = in.rows;      // (N, C)
  const int64_t n = x2.size(0);
  const Tensor b_fc = fc_bias ? fc_bias->checked_data() : Tensor();
  const Tensor b_proj = proj_bias ? proj_bias->checked_data() : Tensor();

  // FP8 where the FP8 plan marked the weights (and the sizes fit).
  const bool fc_fp8 = fp8::applies(fc_weight, n);
  const bool proj_fp8 = fp8::applies(proj_weight, n);
  const bool records = g.should_record({&x}, true);
  ops::Fp8Matrix x_columns, a_columns;  // (C, N), (F, N) FP8: for the FP8 weight gradients
  Tensor h = ctx.empty(Shape{n, h_f}, x.dtype());  // (N, F or 2F): the activation's input
  Tensor a;                                          // (N, F): the activation
  // SwiGLU before an FP8 proj is computed by proj's cast as it reads h: `a` is not stored.
  const bool swiglu_in_cast = !gelu && proj_fp8;
  // fc's input in FP8 is kept as its transposed FP8 copy, but under sequence parallelism,
  // which keeps only this rank's part of it (see saved_x).
  const bool keep_x = records && !gathered;
  if (gelu) {
    a = ctx.empty(Shape{n, f}, x.dtype());
    x_columns =
        detail::product(ctx, a, x2, fc_weight, fc_fp8, b_fc, ops::Epilogue::Gelu, h, keep_x);
  } else {
    x_columns = detail::product(ctx, h, x2, fc_weight, fc_fp8, b_fc, ops::Epilogue::None,
                                Tensor(), keep_x);
    if (!swiglu_in_cast) {
      a = ctx.empty(Shape{n, f}, x.dtype());
      ops::swiglu_forward(ctx, a, h);
    }
  }
  Tensor y = ctx.empty(with_last(whole.shape(), c), x.dtype());  // (..., C)
  // Before an FP8 proj the activation's transposed FP8 copy is kept even under selective
  // recompute: one byte per element, half of the bf16 activation that recompute avoids
  // keeping, written by the forward's cast in the same read, where recomputing it would
  // read the activation's input again (2F values per token for SwiGLU) and, for GELU,
  // write and read the activation too.
  const fp8::Source proj_in =
      swiglu_in_cast ? fp8::Source(ops::Fp8CastSource::swiglu, h) : fp8::Source(a);
  a_columns = detail::product(ctx, y.view(Shape{n, c}), proj_in, proj_weight, proj_fp8, b_proj,
                              ops::Epilogue::None, Tensor(), records);
  if (!records) return y;

  y = Graph::track(y);
  const Tensor saved_a = recompute_activation || a_columns.defined() ? Tensor() : a;
  // Saved for fc's weight gradient: the input, or under sequence parallelism only this
  // rank's part of it (gathered again, and in FP8 quantized again, in the backward); in
  // FP8 otherwise its transposed FP8 copy.
  const Tensor saved_x = gathered ? ops::contiguous(ctx, x) : fc_fp8 ? Tensor() : x2;
  g.record("mlp:" + fc_weight.name(), {y.autograd_meta()},
           [tx = Graph::target(x), saved_x, h, saved_a, ym = y.autograd_meta(), &fc_weight, fc_bias,
            &proj_weight, proj_bias, activation, n, c, h_f, f, column, gathered, fc_fp8,
            proj_fp8, x_columns, a_columns, gelu, whole_shape = whole.shape()](Graph& g) {
             Tensor dy = Graph::grad_of(ym);
             if (!dy.defined()) return;
             Context& ctx = g.ctx();
             // Column-parallel under sequence parallelism: the input gathered again while
             // proj's gradients are computed.
             std::optional<SequenceExchange> regather;
             if (gathered) regather = SequenceExchange::start_gather(ctx, saved_x, *column.group);
             dy = rows(ctx, dy, c);  // (N, C)
             // The activation for proj's weight gradient: its FP8 copy (an FP8 proj), or
             // saved, or recomputed.
             Tensor a = saved_a;
             if (!a.defined() && !proj_fp8) {
               a = ctx.empty(Shape{n, f}, h.dtype());  // (N, F), recomputed
               detail::mlp_activation(ctx, activation, a, h);
             }
             // dW_proj (C, F) += dy^T (C, N) @ a (N, F); db_proj (C) += column sums of dy
             std::optional<ops::Fp8Quantized> qdy;
             if (proj_fp8) qdy = fp8::quantize_output_grad(ctx, dy, proj_weight, proj_bias);
             detail::weight_product(ctx, proj_weight, proj_bias, dy, qdy, a_columns, a);
             a = Tensor();  // freed before the (N, F or 2F) gradient is allocated
             // da (N, F) = dy @ W_proj [times gelu'(h): the GELU gradient in the same matmul]
             auto input_grad = [&](const Tensor& out, ops::Epilogue ep, const Tensor& aux) {
               detail::input_product(ctx, out, dy, qdy, proj_weight, 0.0, ep, aux);
             };
             // dh (N, F or 2F): the gradient at the activation's input. In FP8, dh quantized
             // once for both of fc's products (db_fc from the same read), by a cast that
             // computes it as it reads da (N, F) and h, rather than after a pass of its own;
             // but a bf16 proj has the GELU gradient in its matmul's epilogue.
             Tensor dh;
             std::optional<ops::Fp8Quantized> qdh;
             if (fc_fp8 && (qdy || !gelu)) {
               const Tensor da = ctx.empty(Shape{n, f}, dy.dtype());
               input_grad(da, ops::Epilogue::None, Tensor());
               qdy.reset();
               qdh = fp8::quantize_activation_grad(
                   ctx, gelu ? ops::Fp8CastSource::gelu_grad : ops::Fp8CastSource::swiglu_grad, da,
                   h, fc_weight, fc_bias);
             } else {
               dh = ctx.empty(Shape{n, h_f}, dy.dtype());
               if (gelu) {
                 input_grad(dh, ops::Epilogue::DGelu, h);
               } else {
                 Tensor da = ctx.empty(Shape{n, f}, dy.dtype());
                 input_grad(da, ops::Epilogue::None, Tensor());
                 ops::swiglu_backward(ctx, dh, da, h);
               }
               qdy.reset();
               if (fc_fp8) qdh = fp8::quantize_output_grad(ctx, dh, fc_weight, fc_bias);
             }
             // dx (N, C) (+)= dh @ W_fc (F or 2F, C)
             auto fc_input_grad = [&](const Tensor& dx, double beta) {
               detail::input_product(ctx, dx, dh, qdh, fc_weight, beta);
             };
             // Column-parallel: this rank's part of dx, summed over the group while fc's
             // weight gradient is computed.
             std::optional<ColumnInputGrad> dx =
                 ColumnInputGrad::compute(g, tx, column, whole_shape, c, dy.dtype(), fc_input_grad);
             // dW_fc (F or 2F, C) += dh^T @ x (N, C); db_fc += column sums of dh
             const Tensor x2 = gathered ? rows(ctx, regather->finish(ctx), c) : saved_x;
             detail::weight_product(ctx, fc_weight, fc_bias, dh, qdh, x_columns, x2);
             if (dx) g.accumulate(tx, dx->finish(ctx));
           });
  return y;
}

}  // namespace fsdp::nn
