#include "kernels/cpu/rope.h"

#include <cmath>

#include "kernels/cpu/float_types.h"
#include "kernels/scalar_math.h"

namespace fsdp::kernels::cpu {

void rope(const RopeDims& d, void* out, const void* x, DType dtype) {
  dispatch_compute(dtype, "rope", [&](auto tag) {
    using T = decltype(tag);
    const int64_t half = d.head_dim / 2;
    const double sign = d.inverse ? -1.0 : 1.0;
    for (int64_t t = 0; t < d.seq; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const double angle = double(d.position_offset + t) * rope_inv_freq(i, d.head_dim, d.theta);
        const double c = std::cos(angle), sn = sign * std::sin(angle);
        for (int64_t b = 0; b < d.batch; ++b) {
          for (int64_t h = 0; h < d.heads; ++h) {
            const T* v = static_cast<const T*>(x) + b * d.x.b + t * d.x.t + h * d.x.h;  // (D)
            T* o = static_cast<T*>(out) + b * d.out.b + t * d.out.t + h * d.out.h;        // (D)
            // Both read before either is written: in place is safe.
            const double x1 = double(v[i]), x2 = double(v[i + half]);
            o[i] = T(x1 * c - x2 * sn);
            o[i + half] = T(x2 * c + x1 * sn);
          }
        }
      }
    }
  });
}

}  // namespace fsdp::kernels::cpu
