#include "kernels/cpu/adamw_f32.h"

#include <type_traits>

#include "runtime/core/dtype.h"
#include "runtime/core/error.h"

namespace fsdp::kernels::cpu {
namespace {

// bf16 as its raw bits, so the conversions are plain integer operations the loops vectorize.
inline float load(float v) { return v; }
inline float load(uint16_t bf16_bits) { return bits_float(uint32_t(bf16_bits) << 16); }
template <typename T>
inline T store(float v);
template <>
inline float store<float>(float v) {
  return v;
}
template <>
inline uint16_t store<uint16_t>(float v) {
  return bf16::from_float(v);
}

template <typename G, typename M, typename C>
void update(float* p, const G* g, M* m, M* v, C* copy, int64_t n, const AdamWScalars& s) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float pi = p[i], mi = load(m[i]), vi = load(v[i]);
    adamw_update<float>(pi, mi, vi, load(g[i]), s);
    p[i] = pi;
    m[i] = store<M>(mi);
    v[i] = store<M>(vi);
    if constexpr (!std::is_void_v<C>) copy[i] = store<C>(pi);
  }
}

// f(float{}) or f(uint16_t{}) (bf16 bits) for the dtype of `what`.
template <typename F>
void dispatch(DType t, const char* what, F&& f) {
  if (t == DType::f32) return f(float{});
  if (t == DType::bf16) return f(uint16_t{});
  FSDP_THROW(DTypeError, "adamw_step_f32: ", what, " must be f32 or bf16, got ", dtype_name(t));
}

}  // namespace

void adamw_step_f32(const AdamWBuffers& buf, int64_t n, const AdamWScalars& s) {
  FSDP_CHECK(buf.param_dtype == DType::f32, DTypeError,
             "adamw_step_f32: the master parameters must be f32, got ", dtype_name(buf.param_dtype));
  float* p = static_cast<float*>(buf.param);
  dispatch(buf.grad_dtype, "the gradient", [&](auto gtag) {
    using G = decltype(gtag);
    dispatch(buf.moment_dtype, "the moments", [&](auto mtag) {
      using M = decltype(mtag);
      const G* g = static_cast<const G*>(buf.grad);
      M* m = static_cast<M*>(buf.exp_avg);
      M* v = static_cast<M*>(buf.exp_avg_sq);
      if (!buf.param_copy) return update<G, M, void>(p, g, m, v, nullptr, n, s);
      dispatch(buf.copy_dtype, "the parameter copy", [&](auto ctag) {
        using C = decltype(ctag);
        update<G, M, C>(p, g, m, v, static_cast<C*>(buf.param_copy), n, s);
      });
    });
  });
}

}  // namespace fsdp::kernels::cpu
