// Dispatch of the counter-based initializers (kernels/init.h).
#include "kernels/init.h"

#include "kernels/checks.h"
#include "kernels/cpu/init.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/init.h"
#endif

namespace fsdp::ops {

using namespace detail;

void init_normal(Context& ctx, const Tensor& out, uint64_t seed, uint64_t key, int64_t offset,
                 double mean, double std) {
  const char* what = "init_normal";
  check_flat(ctx, out, out.numel(), what);
  FSDP_CHECK(offset >= 0, IndexError, what, ": negative offset ", offset);
  FSDP_CHECK(std >= 0, ValueError, what, ": negative standard deviation ", std);
  if (ctx.device().is_cpu()) {
    kernels::cpu::init_normal(out.data_ptr(), out.dtype(), out.numel(), seed, key, offset, mean, std);
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::init_normal(out.data_ptr(), out.dtype(), out.numel(), seed, key, offset, mean, std,
                             ctx.stream().cuda_stream());
#endif
}

void init_uniform(Context& ctx, const Tensor& out, uint64_t seed, uint64_t key, int64_t offset,
                  double low, double high) {
  const char* what = "init_uniform";
  check_flat(ctx, out, out.numel(), what);
  FSDP_CHECK(offset >= 0, IndexError, what, ": negative offset ", offset);
  FSDP_CHECK(low <= high, ValueError, what, ": empty range [", low, ", ", high, ")");
  if (ctx.device().is_cpu()) {
    kernels::cpu::init_uniform(out.data_ptr(), out.dtype(), out.numel(), seed, key, offset, low,
                               high);
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::init_uniform(out.data_ptr(), out.dtype(), out.numel(), seed, key, offset, low,
                              high, ctx.stream().cuda_stream());
#endif
}

uint64_t name_key(const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64-bit offset basis
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;  // FNV prime
  }
  return h;
}

}  // namespace fsdp::ops
