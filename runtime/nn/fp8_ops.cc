// The FP8 linear layer and MLP (functional.h, "FP8"): linear() and mlp() with their products
// on FP8 tensor cores.
//
// cuBLASLt multiplies FP8 operands only with K contiguous in both (ops::fp8_matmul:
// a (M, K) @ b (N, K)^T), so each product needs its operands in a particular layout:
//   forward  y (N, out)  = x (N, in)    @ W (out, in)^T     x, W as stored
//   dgrad    dx (N, in)  = dy (N, out)  @ W^T (in, out)^T   W transposed
//   wgrad    dW (out,in) = dy^T (out,N) @ x^T (in, N)^T     dy and x transposed
// The quantize kernel writes a tensor's FP8 bytes and its transpose in one pass, so x is
// quantized once in forward (its transpose kept for wgrad) and dy once in backward.
#include <optional>

#include "kernels/fp8_math.h"
#include "kernels/ops.h"
#include "runtime/nn/functional.h"
#include "runtime/nn/op_support.h"

namespace fsdp::nn {

using detail::rows;
using detail::with_last;

std::string Fp8Recipe::str() const {
  if (backward == DType::f8e5m2)
    return str_cat("hybrid (", dtype_name(forward), " forward, e5m2 gradients)");
  return str_cat(dtype_name(forward), " (forward and gradients)");
}

Fp8Recipe fp8_recipe_from_name(const std::string& name) {
  if (name == "hybrid") return Fp8Recipe{DType::f8e4m3, DType::f8e5m2};
  if (name == "e4m3") return Fp8Recipe{DType::f8e4m3, DType::f8e4m3};
  FSDP_THROW(ConfigError, "FP8 recipe '", name, "' is not one of: e4m3, hybrid");
}

bool fp8_applies(const Graph& g, const Tensor& x, const std::string& layer) {
  const int64_t tokens = x.size(-1) ? x.numel() / x.size(-1) : 0;
  if (tokens > 0 && tokens % kFp8Multiple == 0) return true;
  FSDP_CHECK(!g.grad_enabled(), ShapeError, "FP8 layer ", layer, ": ", tokens,
             " tokens is not a multiple of ", kFp8Multiple, ", which FP8 matmuls need (input ",
             x.str(), "); train with micro_batch_size * seq_length a multiple of ",
             kFp8Multiple);
  return false;
}

namespace {

// A matrix quantized to FP8 with one scale: its bytes as stored (R, C) and/or transposed
// (C, R), and its scales [amax, scale, scale_inv] (3) f32.
struct Quantized {
  Tensor data, data_t, scales;
};

// x2 (R, C) contiguous in FP8 `fp8`, in the layouts asked for.
Quantized quantize(Context& ctx, const Tensor& x2, DType fp8, bool plain, bool transposed) {
  Quantized q;
  q.scales = ctx.empty(Shape{kernels::kFp8Scales}, DType::f32);
  ops::fp8_scales(ctx, q.scales, x2, fp8);
  if (plain) q.data = ctx.empty(x2.shape(), fp8);
  if (transposed) q.data_t = ctx.empty(Shape{x2.size(1), x2.size(0)}, fp8);
  ops::fp8_quantize(ctx, q.data, q.data_t, x2, q.scales);
  return q;
}

void check_fp8_features(const Tensor& w, const Parameter& weight) {
  FSDP_CHECK(w.size(0) % kFp8Multiple == 0 && w.size(1) % kFp8Multiple == 0, ShapeError,
             "FP8 layer ", weight.name(), ": weight ", w.str(), " needs both sizes multiples of ",
             kFp8Multiple);
}

// dW (out, in) += dy^T @ x from dy's transpose (out, N) and x's (in, N), and db (out) += the
// column sums of dy (N, out) (in the compute dtype, read once more).
void fp8_weight_and_bias_grad(Context& ctx, Parameter& weight, Parameter* bias,
                              const Quantized& dy_q, const Tensor& dy, const Tensor& x_t,
                              const Tensor& x_scales) {
  ops::fp8_matmul(ctx, weight.grad_for_accumulation(ctx), dy_q.data_t, dy_q.scales, x_t,
                  x_scales, 1.0);
  if (bias) ops::bias_backward(ctx, bias->grad_for_accumulation(ctx), dy, true);
}

// out (N, in) (+)= dy (N, out) @ W (out, in), from dy's FP8 bytes and W quantized again
// transposed (in, out). The weight's scale is recomputed from its current values: the
// forward's, since the weight has not changed within the step.
void fp8_input_grad(Context& ctx, const Tensor& out, const Quantized& dy_q, Parameter& weight,
                    DType fp8, bool accumulate) {
  const Quantized w_t = quantize(ctx, weight.checked_data(), fp8, false, true);
  ops::fp8_matmul(ctx, out, dy_q.data, dy_q.scales, w_t.data_t, w_t.scales, accumulate ? 1.0 : 0.0);
}

void activation_forward(Context& ctx, MlpActivation act, const Tensor& out, const Tensor& h) {
  if (act == MlpActivation::Gelu)
    ops::gelu_forward(ctx, out, h);
  else
    ops::swiglu_forward(ctx, out, h);
}

}  // namespace

// ---------------------------------------------------------------- linear

Tensor fp8_linear(Graph& g, const Tensor& x, Parameter& weight, Parameter* bias,
                  ops::Epilogue epilogue, const Fp8Recipe& recipe) {
  Context& ctx = g.ctx();
  FSDP_CHECK(!weight.vocab_parallel, ValueError, "fp8_linear ", weight.name(),
             ": a vocabulary-parallel weight runs only in the loss (classifier_loss)");
  const Tensor& w = weight.checked_data();  // (out, in)
  const int64_t out_f = w.size(0), in_f = w.size(1);
  FSDP_CHECK(x.dim() >= 1 && x.size(-1) == in_f, ShapeError, "fp8_linear ", weight.name(),
             ": input ", x.str(), " does not end in ", in_f, " features");
  detail::check_compute_dtype(x, weight, "fp8_linear");
  check_fp8_features(w, weight);
  FSDP_CHECK(epilogue == ops::Epilogue::None || epilogue == ops::Epilogue::Gelu, ValueError,
             "fp8_linear ", weight.name(), ": epilogue None or Gelu only");
  const Tensor x2 = rows(ctx, x, in_f);  // (N, in)
  const int64_t n = x2.size(0);
  const bool record = g.should_record({&x}, true);
  // x's transpose is what the weight gradient needs: made in the same pass, kept instead of x.
  const Quantized x_q = quantize(ctx, x2, recipe.forward, true, record);
  const Quantized w_q = quantize(ctx, w, recipe.forward, true, false);
  Tensor y = ctx.empty(with_last(x.shape(), out_f), w.dtype());  // (..., out)
  const bool gelu = epilogue == ops::Epilogue::Gelu;
  const Tensor pre = gelu ? ctx.empty(Shape{n, out_f}, w.dtype()) : Tensor();  // (N, out)
  ops::fp8_matmul(ctx, y.view(Shape{n, out_f}), x_q.data, x_q.scales, w_q.data, w_q.scales, 0.0,
                  bias ? bias->checked_data() : Tensor(), epilogue, pre);
  if (!record) return y;

  y = Graph::track(y);
  Parameter* wp = &weight;
  g.record("fp8_linear:" + weight.name(), {y.autograd_meta()},
           [tx = Graph::target(x), x_t = x_q.data_t, x_scales = x_q.scales, pre,
            ym = y.autograd_meta(), wp, bias, gelu, n, out_f, in_f, recipe](Graph& g) {
             Tensor dy = Graph::grad_of(ym);
             if (!dy.defined()) return;
             Context& ctx = g.ctx();
             dy = rows(ctx, dy, out_f);  // (N, out)
             if (gelu) {
               Tensor dpre = ctx.empty(Shape{n, out_f}, dy.dtype());  // (N, out)
               ops::gelu_backward(ctx, dpre, dy, pre);
               dy = dpre;
             }
             // dy in FP8: as stored (N, out) for dx, transposed (out, N) for dW.
             const Quantized dy_q = quantize(ctx, dy, recipe.backward, tx.defined(), true);
             const autograd::GradSink sx = g.grad_sink(tx);
             if (sx.defined())  // dx (N, in) (+)= dy @ W
               fp8_input_grad(ctx, sx.buffer.view(Shape{n, in_f}), dy_q, *wp, recipe.forward,
                              sx.accumulate);
             fp8_weight_and_bias_grad(ctx, *wp, bias, dy_q, dy, x_t, x_scales);
           });
  return y;
}

// ---------------------------------------------------------------- MLP

Tensor fp8_mlp(Graph& g, const Tensor& x, Parameter& fc_weight, Parameter* fc_bias,
               Parameter& proj_weight, Parameter* proj_bias, MlpActivation activation,
               bool recompute_activation, const Fp8Recipe& recipe) {
  Context& ctx = g.ctx();
  const Tensor& w_fc = fc_weight.checked_data();      // (F or 2F, C)
  const Tensor& w_proj = proj_weight.checked_data();  // (C, F)
  const int64_t c = w_fc.size(1), h_f = w_fc.size(0), f = w_proj.size(1);
  const bool gelu = activation == MlpActivation::Gelu;
  FSDP_CHECK(x.dim() >= 1 && x.size(-1) == c, ShapeError, "fp8_mlp ", fc_weight.name(),
             ": input ", x.str(), " does not end in ", c, " features");
  FSDP_CHECK(w_proj.size(0) == c && h_f == (gelu ? f : 2 * f), ShapeError, "fp8_mlp: ",
             fc_weight.name(), " ", w_fc.str(), " and ", proj_weight.name(), " ", w_proj.str(),
             " do not fit a ", gelu ? "GELU" : "SwiGLU", " MLP");
  detail::check_compute_dtype(x, fc_weight, "fp8_mlp");
  check_fp8_features(w_fc, fc_weight);
  check_fp8_features(w_proj, proj_weight);
  const Tensor x2 = rows(ctx, x, c);  // (N, C)
  const int64_t n = x2.size(0);
  const bool record = g.should_record({&x}, true);
  const Tensor b_fc = fc_bias ? fc_bias->checked_data() : Tensor();
  const Tensor b_proj = proj_bias ? proj_bias->checked_data() : Tensor();

  const Quantized x_q = quantize(ctx, x2, recipe.forward, true, record);
  Tensor h = ctx.empty(Shape{n, h_f}, w_fc.dtype());  // (N, F or 2F): the activation's input
  Tensor a = ctx.empty(Shape{n, f}, w_fc.dtype());    // (N, F): the activation
  {
    const Quantized fc_q = quantize(ctx, w_fc, recipe.forward, true, false);
    if (gelu) {
      ops::fp8_matmul(ctx, a, x_q.data, x_q.scales, fc_q.data, fc_q.scales, 0.0, b_fc,
                      ops::Epilogue::Gelu, h);
    } else {
      ops::fp8_matmul(ctx, h, x_q.data, x_q.scales, fc_q.data, fc_q.scales, 0.0, b_fc);
      ops::swiglu_forward(ctx, a, h);
    }
  }
  // The activation's transpose is proj's weight-gradient operand: kept unless recomputed.
  const Quantized a_q = quantize(ctx, a, recipe.forward, true, record && !recompute_activation);
  a = Tensor();
  Tensor y = ctx.empty(with_last(x.shape(), c), w_fc.dtype());  // (..., C)
  {
    const Quantized proj_q = quantize(ctx, w_proj, recipe.forward, true, false);
    ops::fp8_matmul(ctx, y.view(Shape{n, c}), a_q.data, a_q.scales, proj_q.data, proj_q.scales,
                    0.0, b_proj);
  }
  if (!record) return y;

  y = Graph::track(y);
  g.record("fp8_mlp:" + fc_weight.name(), {y.autograd_meta()},
           [tx = Graph::target(x), x_t = x_q.data_t, x_scales = x_q.scales, h,
            a_t = a_q.data_t, a_scales = a_q.scales, ym = y.autograd_meta(), &fc_weight,
            fc_bias, &proj_weight, proj_bias, activation, n, c, h_f, f, recipe](Graph& g) {
             Tensor dy = Graph::grad_of(ym);
             if (!dy.defined()) return;
             Context& ctx = g.ctx();
             dy = rows(ctx, dy, c);  // (N, C)
             const Quantized dy_q = quantize(ctx, dy, recipe.backward, true, true);
             // The activation's FP8 transpose: kept, or recomputed from h (the same bytes:
             // the same values give the same amax and the same casts).
             Quantized act{Tensor(), a_t, a_scales};
             if (!act.data_t.defined()) {
               Tensor a = ctx.empty(Shape{n, f}, h.dtype());  // (N, F), recomputed
               activation_forward(ctx, activation, a, h);
               act = quantize(ctx, a, recipe.forward, false, true);
             }
             // dW_proj (C, F) += dy^T @ a; db_proj (C) += column sums of dy
             fp8_weight_and_bias_grad(ctx, proj_weight, proj_bias, dy_q, dy, act.data_t,
                                      act.scales);
             act = Quantized();
             // da (N, F) = dy @ W_proj, then dh (N, F or 2F) through the activation.
             Tensor dh = ctx.empty(Shape{n, h_f}, dy.dtype());
             {
               const Tensor da = ctx.empty(Shape{n, f}, dy.dtype());
               fp8_input_grad(ctx, da, dy_q, proj_weight, recipe.forward, false);
               if (activation == MlpActivation::Gelu)
                 ops::gelu_backward(ctx, dh, da, h);
               else
                 ops::swiglu_backward(ctx, dh, da, h);
             }
             const Quantized dh_q = quantize(ctx, dh, recipe.backward, tx.defined(), true);
             // dW_fc (F or 2F, C) += dh^T @ x; db_fc += column sums of dh
             fp8_weight_and_bias_grad(ctx, fc_weight, fc_bias, dh_q, dh, x_t, x_scales);
             const autograd::GradSink sx = g.grad_sink(tx);
             if (sx.defined())  // dx (N, C) (+)= dh @ W_fc
               fp8_input_grad(ctx, sx.buffer.view(Shape{n, c}), dh_q, fc_weight, recipe.forward,
                              sx.accumulate);
           });
  return y;
}

}  // namespace fsdp::nn
