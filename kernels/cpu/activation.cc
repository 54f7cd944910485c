#include "kernels/cpu/activation.h"

#include "kernels/cpu/float_types.h"
#include "kernels/scalar_math.h"

namespace fsdp::kernels::cpu {

void gelu_forward(void* out, const void* x, int64_t n, DType dtype) {
  dispatch_compute(dtype, "gelu_forward", [&](auto tag) {
    using T = decltype(tag);
    const T* xs = static_cast<const T*>(x);
    T* ys = static_cast<T*>(out);
    for (int64_t i = 0; i < n; ++i) ys[i] = T(gelu_tanh(double(xs[i])));
  });
}

void gelu_backward(void* dx, const void* dout, const void* x, int64_t n, DType dtype) {
  dispatch_compute(dtype, "gelu_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* xs = static_cast<const T*>(x);
    const T* gs = static_cast<const T*>(dout);
    T* dxs = static_cast<T*>(dx);
    for (int64_t i = 0; i < n; ++i) dxs[i] = T(double(gs[i]) * gelu_tanh_grad(double(xs[i])));
  });
}

void swiglu_forward(void* out, const void* x, int64_t rows, int64_t features, DType dtype) {
  dispatch_compute(dtype, "swiglu_forward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t F = features;
    for (int64_t r = 0; r < rows; ++r) {
      const T* gate = static_cast<const T*>(x) + r * 2 * F;  // (F), then up (F)
      const T* up = gate + F;
      T* y = static_cast<T*>(out) + r * F;
      for (int64_t f = 0; f < F; ++f) y[f] = T(silu(double(gate[f])) * double(up[f]));
    }
  });
}

void swiglu_backward(void* dx, const void* dout, const void* x, int64_t rows, int64_t features,
                     DType dtype) {
  dispatch_compute(dtype, "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t F = features;
    for (int64_t r = 0; r < rows; ++r) {
      const T* gate = static_cast<const T*>(x) + r * 2 * F;
      const T* up = gate + F;
      const T* g = static_cast<const T*>(dout) + r * F;
      T* dgate = static_cast<T*>(dx) + r * 2 * F;
      T* dup = dgate + F;
      for (int64_t f = 0; f < F; ++f) {
        const double a = double(gate[f]), u = double(up[f]), go = double(g[f]);
        dgate[f] = T(go * u * silu_grad(a));
        dup[f] = T(go * silu(a));
      }
    }
  });
}

}  // namespace fsdp::kernels::cpu
