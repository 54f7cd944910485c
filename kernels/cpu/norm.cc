#include "kernels/cpu/norm.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/float_types.h"

namespace fsdp::kernels::cpu {
namespace {

// Calls f(T{}, G{}) for the compute and grad types of `d`.
template <typename F>
void dispatch_norm(const NormDims& d, const char* what, F&& f) {
  dispatch_compute(d.dtype, what, [&](auto t) {
    dispatch_compute(d.grad_dtype, what, [&](auto g) { f(t, g); });
  });
}

// Adds the per-channel sums of one norm's backward into the parameter gradients.
template <typename G>
void store_param_grad(void* grad, const std::vector<double>& sums, bool accumulate) {
  if (!grad) return;
  G* g = static_cast<G*>(grad);
  for (size_t c = 0; c < sums.size(); ++c) store_or_add(g[c], sums[c], accumulate);
}

// Row n of the norm's input: x's row, or (with a residual) x + residual stored into `sum`,
// added in T like the add kernel, so the fused forward equals an add followed by the norm.
template <typename T>
const T* input_row(const void* x, const void* residual, void* sum, int64_t n, int64_t C) {
  const T* xr = static_cast<const T*>(x) + n * C;
  if (!residual) return xr;
  const T* rr = static_cast<const T*>(residual) + n * C;
  T* sr = static_cast<T*>(sum) + n * C;
  for (int64_t c = 0; c < C; ++c) sr[c] = T(xr[c] + rr[c]);
  return sr;
}

// dx = addend + v, rounded once.
template <typename T>
void store_dx(T* dx, const T* addend, int64_t i, double v) {
  dx[i] = from_double<T>(addend ? to_double(addend[i]) + v : v);
}

}  // namespace

void layernorm_forward(const NormDims& d, void* out, void* mean, void* rstd, const void* x,
                       const void* residual, void* sum, const void* weight, const void* bias,
                       double eps) {
  dispatch_compute(d.dtype, "layernorm_forward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t C = d.channels;
    const T* w = static_cast<const T*>(weight);
    const T* b = static_cast<const T*>(bias);
    for (int64_t n = 0; n < d.rows; ++n) {
      const T* xr = input_row<T>(x, residual, sum, n, C);  // (C)
      T* yr = static_cast<T*>(out) + n * C;
      double m = 0;
      for (int64_t c = 0; c < C; ++c) m += double(xr[c]);
      m /= double(C);
      double var = 0;
      for (int64_t c = 0; c < C; ++c) var += (double(xr[c]) - m) * (double(xr[c]) - m);
      const double r = 1.0 / std::sqrt(var / double(C) + eps);
      for (int64_t c = 0; c < C; ++c) {
        const double v = (double(xr[c]) - m) * r * double(w[c]) + (b ? double(b[c]) : 0.0);
        yr[c] = T(v);
      }
      static_cast<T*>(mean)[n] = T(m);
      static_cast<T*>(rstd)[n] = T(r);
    }
  });
}

// With xhat = (x - mean) * rstd and g = dout * weight:
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
//   dweight = sum over rows of dout * xhat,   dbias = sum over rows of dout.
void layernorm_backward(const NormDims& d, void* dx, const void* dx_addend, void* dweight,
                        void* dbias, const void* dout, const void* x, const void* weight,
                        const void* mean, const void* rstd, bool accumulate) {
  dispatch_norm(d, "layernorm_backward", [&](auto ttag, auto gtag) {
    using T = decltype(ttag);
    using G = decltype(gtag);
    const int64_t C = d.channels;
    const T* w = static_cast<const T*>(weight);
    std::vector<double> dw(size_t(C), 0.0), db(size_t(C), 0.0);
    for (int64_t n = 0; n < d.rows; ++n) {
      const T* xr = static_cast<const T*>(x) + n * C;
      const T* gr = static_cast<const T*>(dout) + n * C;
      const double m = double(static_cast<const T*>(mean)[n]);
      const double r = double(static_cast<const T*>(rstd)[n]);
      double sum_g = 0, sum_gx = 0;
      for (int64_t c = 0; c < C; ++c) {
        const double xhat = (double(xr[c]) - m) * r;
        const double g = double(gr[c]) * double(w[c]);
        sum_g += g;
        sum_gx += g * xhat;
        dw[size_t(c)] += double(gr[c]) * xhat;
        db[size_t(c)] += double(gr[c]);
      }
      if (!dx) continue;
      T* dxr = static_cast<T*>(dx) + n * C;
      const T* ar = dx_addend ? static_cast<const T*>(dx_addend) + n * C : nullptr;
      for (int64_t c = 0; c < C; ++c) {
        const double xhat = (double(xr[c]) - m) * r;
        const double g = double(gr[c]) * double(w[c]);
        store_dx(dxr, ar, c, r * (g - sum_g / double(C) - xhat * sum_gx / double(C)));
      }
    }
    store_param_grad<G>(dweight, dw, accumulate);
    store_param_grad<G>(dbias, db, accumulate);
  });
}

void rmsnorm_forward(const NormDims& d, void* out, void* rstd, const void* x, const void* residual,
                     void* sum, const void* weight, double eps) {
  dispatch_compute(d.dtype, "rmsnorm_forward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t C = d.channels;
    const T* w = static_cast<const T*>(weight);
    for (int64_t n = 0; n < d.rows; ++n) {
      const T* xr = input_row<T>(x, residual, sum, n, C);  // (C)
      T* yr = static_cast<T*>(out) + n * C;
      double ss = 0;
      for (int64_t c = 0; c < C; ++c) ss += double(xr[c]) * double(xr[c]);
      const double r = 1.0 / std::sqrt(ss / double(C) + eps);
      for (int64_t c = 0; c < C; ++c) yr[c] = T(double(xr[c]) * r * double(w[c]));
      static_cast<T*>(rstd)[n] = T(r);
    }
  });
}

// With xhat = x * rstd and g = dout * weight: dx = rstd * (g - xhat * mean(g * xhat)),
// dweight = sum over rows of dout * xhat.
void rmsnorm_backward(const NormDims& d, void* dx, const void* dx_addend, void* dweight,
                      const void* dout, const void* x, const void* weight, const void* rstd,
                      bool accumulate) {
  dispatch_norm(d, "rmsnorm_backward", [&](auto ttag, auto gtag) {
    using T = decltype(ttag);
    using G = decltype(gtag);
    const int64_t C = d.channels;
    const T* w = static_cast<const T*>(weight);
    std::vector<double> dw(size_t(C), 0.0);
    for (int64_t n = 0; n < d.rows; ++n) {
      const T* xr = static_cast<const T*>(x) + n * C;
      const T* gr = static_cast<const T*>(dout) + n * C;
      const double r = double(static_cast<const T*>(rstd)[n]);
      double sum_gx = 0;
      for (int64_t c = 0; c < C; ++c) {
        const double xhat = double(xr[c]) * r;
        sum_gx += double(gr[c]) * double(w[c]) * xhat;
        dw[size_t(c)] += double(gr[c]) * xhat;
      }
      if (!dx) continue;
      T* dxr = static_cast<T*>(dx) + n * C;
      const T* ar = dx_addend ? static_cast<const T*>(dx_addend) + n * C : nullptr;
      for (int64_t c = 0; c < C; ++c) {
        const double xhat = double(xr[c]) * r;
        const double g = double(gr[c]) * double(w[c]);
        store_dx(dxr, ar, c, r * (g - xhat * sum_gx / double(C)));
      }
    }
    store_param_grad<G>(dweight, dw, accumulate);
  });
}

}  // namespace fsdp::kernels::cpu
