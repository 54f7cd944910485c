// Scalar formulas of the transformer ops, written once for both backends. T is the compute
// type: float (f32 and bf16 data) or double (f64 data).
#pragma once

#include <math.h>

#include "kernels/host_device.h"

namespace fsdp::kernels {

// GELU, tanh approximation (GPT-2's): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <typename T>
FSDP_HD T gelu_tanh(T x) {
  const T k = T(0.7978845608028654), c = T(0.044715);
  return T(0.5) * x * (T(1) + tanh(k * (x + c * x * x * x)));
}

// d gelu_tanh / dx.
template <typename T>
FSDP_HD T gelu_tanh_grad(T x) {
  const T k = T(0.7978845608028654), c = T(0.044715);
  const T th = tanh(k * (x + c * x * x * x));
  const T sech2 = T(1) - th * th;
  return T(0.5) * (T(1) + th) + T(0.5) * x * sech2 * k * (T(1) + T(3) * c * x * x);
}

template <typename T>
FSDP_HD T sigmoid(T x) {
  return T(1) / (T(1) + exp(-x));
}

// silu(g) = g * sigmoid(g); its derivative is s (1 + g (1 - s)) with s = sigmoid(g).
template <typename T>
FSDP_HD T silu(T g) {
  return g * sigmoid(g);
}
template <typename T>
FSDP_HD T silu_grad(T g) {
  const T s = sigmoid(g);
  return s * (T(1) + g * (T(1) - s));
}

// Top-k routing. An expert's selection key is its score plus its balancing bias, added in
// the statistics type S (float for f32 and bf16 logits) from the stored score, so both
// backends order the same values; a NaN key counts as -inf, which makes the order total.
template <typename S>
FSDP_HD S router_key(S score, float bias) {
  const S key = score + S(bias);
  return key != key ? S(-INFINITY) : key;
}
// Expert a (key ka) is chosen before expert b (key kb): a larger key, or an equal one and a
// lower index.
template <typename S>
FSDP_HD bool router_before(S ka, int64_t a, S kb, int64_t b) {
  return ka > kb || (ka == kb && a < b);
}
// Added to the sum of the chosen scores before normalizing by it (as DeepSeek-V3 does): the
// chosen sigmoids of very negative logits may all be 0 in f32.
constexpr double kRouterNormEps = 1e-20;

// One AdamW update of one element, PyTorch's formulation (decoupled weight decay, bias
// correction folded into the step size and the denominator). Updates param, m and v in place.
struct AdamWScalars {
  double lr, beta1, beta2, eps, weight_decay, grad_scale;
  double bias_correction1;       // 1 - beta1^step
  double sqrt_bias_correction2;  // sqrt(1 - beta2^step)
};

template <typename T>
FSDP_HD void adamw_update(T& param, T& m, T& v, T grad, const AdamWScalars& s) {
  const T g = grad * T(s.grad_scale);
  param *= T(1) - T(s.lr) * T(s.weight_decay);
  m = T(s.beta1) * m + (T(1) - T(s.beta1)) * g;
  v = T(s.beta2) * v + (T(1) - T(s.beta2)) * g * g;
  const T denom = sqrt(v) / T(s.sqrt_bias_correction2) + T(s.eps);
  param -= T(s.lr) / T(s.bias_correction1) * m / denom;
}

// Rotary embedding frequency of pair i of a head of dimension d: theta^(-2i/d).
FSDP_HD double rope_inv_freq(int64_t i, int64_t d, double theta) {
  return exp(-double(2 * i) / double(d) * log(theta));
}

}  // namespace fsdp::kernels
