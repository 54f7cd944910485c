// Helpers of the transformer-kernel tests: random tensors, host values, element access and
// central finite differences (in f64) for checking backward formulas.
#pragma once

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "kernels/ops.h"
#include "runtime/core/tensor.h"

namespace fsdp::testing {

// Finite differences in f64 agree with exact gradients to ~1e-8 relative (h = 1e-6, smooth
// functions of O(1) inputs: truncation ~h^2, cancellation ~1e-16/h).
constexpr double kFdTol = 1e-7;

inline std::vector<double> uniform_values(int64_t n, uint32_t seed, double lo = -1, double hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v;
  v.reserve(static_cast<size_t>(n));  // not zeroed first: the twins draw tensors of 10^8 values
  for (int64_t i = 0; i < n; ++i) v.push_back(d(rng));
  return v;
}

// A contiguous host f64 tensor over `values` (no copy: valid while the vector lives and is
// not reallocated).
inline Tensor host_view(std::vector<double>& values, const Shape& shape) {
  return Tensor::from_storage(
      Storage::wrap(values.data(), values.size() * sizeof(double), Device::cpu()), shape,
      DType::f64);
}

// ops::from_vector of uniform values, converted straight from them (one pass, no f64 copy).
inline Tensor random_tensor(Context& ctx, const Shape& shape, DType dtype, uint32_t seed,
                            double lo = -1, double hi = 1) {
  if (shape.numel() == 0) return ops::from_vector(ctx, {}, shape, dtype);
  std::vector<double> v = uniform_values(shape.numel(), seed, lo, hi);
  const Tensor host = ops::cast(ctx, host_view(v, shape), dtype);
  return ctx.device().is_cpu() ? host : ops::to_device(ctx, host, ctx.device());
}

// Every element of t (any device, layout, floating dtype) as doubles, in logical order,
// converted straight into the vector returned.
inline std::vector<double> values(Context& ctx, const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  if (!out.empty()) ops::copy(ctx, host_view(out, t.shape()), ops::to_host(ctx, t));
  return out;
}

// Largest |a - b| / max(|b|, floor) over two equally long value lists.
inline double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b,
                           double floor) {
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = std::fabs(a[i] - b[i]) / std::max(std::fabs(b[i]), floor);
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  return a.size() == b.size() ? worst : INFINITY;
}

inline double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double x : a) m = std::max(m, std::fabs(x));
  return m;
}

// The i-th logical element of a strided f64 CPU tensor.
inline double& element(const Tensor& t, int64_t i) {
  int64_t off = 0;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    off += (i % t.size(d)) * t.stride(d);
    i /= t.size(d);
  }
  return t.data<double>()[off];
}

// d loss / d x by central differences, perturbing x (f64, CPU, any layout) in place.
inline std::vector<double> numeric_grad(const Tensor& x, const std::function<double()>& loss,
                                        double h = 1e-6) {
  std::vector<double> g(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    double& xi = element(x, i);
    const double saved = xi;
    xi = saved + h;
    const double up = loss();
    xi = saved - h;
    const double down = loss();
    xi = saved;
    g[size_t(i)] = (up - down) / (2 * h);
  }
  return g;
}

// sum(w * y) over two equally shaped tensors: the scalar whose gradient in y is w.
inline double weighted_sum(Context& ctx, const Tensor& y, const Tensor& w) {
  const std::vector<double> a = values(ctx, y), b = values(ctx, w);
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

}  // namespace fsdp::testing
