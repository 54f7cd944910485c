#include "kernels/cpu/block_reduce.h"

#include "runtime/core/error.h"

namespace fsdp::kernels::cpu {

void block_sum_squares(const void* x, DType dtype, int64_t nblocks, int64_t block, void* out) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x);
    for (int64_t b = 0; b < nblocks; ++b) {
      double acc = 0;
      for (int64_t i = b * block; i < (b + 1) * block; ++i) {
        const double v = to_double(p[i]);
        acc += v * v;
      }
      if (dtype == DType::f64)
        static_cast<double*>(out)[b] = acc;
      else
        static_cast<float*>(out)[b] = float(acc);
    }
  });
}

}  // namespace fsdp::kernels::cpu
