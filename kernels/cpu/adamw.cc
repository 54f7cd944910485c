#include "kernels/cpu/adamw.h"

#include "kernels/cpu/float_types.h"

namespace fsdp::kernels::cpu {

void adamw_step(const AdamWBuffers& buf, int64_t n, const AdamWScalars& s) {
  dispatch_compute(buf.param_dtype, "adamw_step parameter", [&](auto ptag) {
    using P = decltype(ptag);
    dispatch_any_floating(buf.grad_dtype, "adamw_step gradient", [&](auto gtag) {
      using G = decltype(gtag);
      dispatch_any_floating(buf.moment_dtype, "adamw_step moments", [&](auto mtag) {
        using M = decltype(mtag);
        P* p = static_cast<P*>(buf.param);
        const G* g = static_cast<const G*>(buf.grad);
        M* m = static_cast<M*>(buf.exp_avg);
        M* v = static_cast<M*>(buf.exp_avg_sq);
        for (int64_t i = 0; i < n; ++i) {
          double pi = to_double(p[i]), mi = to_double(m[i]), vi = to_double(v[i]);
          adamw_update(pi, mi, vi, to_double(g[i]), s);
          p[i] = from_double<P>(pi);
          m[i] = from_double<M>(mi);
          v[i] = from_double<M>(vi);
        }
        if (!buf.param_copy) return;
        dispatch_any_floating(buf.copy_dtype, "adamw_step parameter copy", [&](auto ctag) {
          using C = decltype(ctag);
          C* c = static_cast<C*>(buf.param_copy);
          for (int64_t i = 0; i < n; ++i) c[i] = from_double<C>(to_double(p[i]));
        });
      });
    });
  });
}

}  // namespace fsdp::kernels::cpu
