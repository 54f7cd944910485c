#include "kernels/cpu/init.h"

#include "kernels/cpu/float_types.h"
#include "kernels/philox.h"

namespace fsdp::kernels::cpu {

void init_normal(void* out, DType dtype, int64_t n, uint64_t seed, uint64_t key, int64_t offset,
                 double mean, double std) {
  dispatch_any_floating(dtype, "init_normal", [&](auto tag) {
    using T = decltype(tag);
    T* o = static_cast<T*>(out);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i)
      o[i] = from_double<T>(random_normal(seed, key, uint64_t(offset + i), mean, std));
  });
}

void init_uniform(void* out, DType dtype, int64_t n, uint64_t seed, uint64_t key, int64_t offset,
                  double low, double high) {
  dispatch_any_floating(dtype, "init_uniform", [&](auto tag) {
    using T = decltype(tag);
    T* o = static_cast<T*>(out);
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i)
      o[i] = from_double<T>(random_uniform(seed, key, uint64_t(offset + i), low, high));
  });
}

}  // namespace fsdp::kernels::cpu
