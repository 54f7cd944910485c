// Helpers of the CUDA-vs-CPU kernel tests: the same values on both devices, and errors
// measured relative to the scale of the reference output.
//
// bf16 convention: inputs are drawn, rounded to bf16 once, and that bf16 tensor is what
// the GPU sees; the CPU reference runs in f32 on exactly those (bf16-rounded) values, so
// the comparison measures only the GPU's arithmetic and its final rounding.
#pragma once

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"
#include "tests/kernels/nn_test_util.h"

namespace fsdp::testing {

struct Dual {
  Tensor cpu;  // f32 (the bf16-rounded values for a bf16 tensor), or f32/f64 as drawn
  Tensor gpu;  // the tensor in the dtype under test
};

inline DType reference_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

inline Dual dual_from_host(Context& cpu, Context& gpu, const Tensor& host_in_dtype) {
  return {ops::cast(cpu, host_in_dtype, reference_dtype(host_in_dtype.dtype())),
          ops::to_device(gpu, host_in_dtype, gpu.device())};
}

inline Dual dual_random(Context& cpu, Context& gpu, const Shape& shape, DType dt, uint32_t seed,
                        double lo = -1, double hi = 1) {
  return dual_from_host(cpu, gpu, random_tensor(cpu, shape, dt, seed, lo, hi));
}

// Uninitialized outputs on both sides: the CPU one in the reference dtype.
inline Dual dual_empty(Context& cpu, Context& gpu, const Shape& shape, DType dt) {
  return {ops::empty(cpu, shape, reference_dtype(dt)), ops::empty(gpu, shape, dt)};
}

inline Dual dual_full(Context& cpu, Context& gpu, const Shape& shape, DType dt, double v) {
  return dual_from_host(cpu, gpu, ops::full(cpu, shape, dt, v));
}

// max |gpu - cpu| / max |cpu|: the error relative to the output's scale.
inline double scaled_error(Context& ctx, const Tensor& gpu, const Tensor& cpu) {
  const std::vector<double> a = values(ctx, gpu), b = values(ctx, cpu);
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(a[i] - b[i]);
    if (std::isnan(d)) return INFINITY;
    worst = std::max(worst, d);
  }
  return worst / std::max(max_abs(b), 1e-30);
}

inline double scaled_error(Context& ctx, const Dual& d) { return scaled_error(ctx, d.gpu, d.cpu); }

// Both sides' values equal bit for bit (for determinism checks on one device).
inline bool same_bits(Context& ctx, const Tensor& a, const Tensor& b) {
  return values(ctx, a) == values(ctx, b);
}

}  // namespace fsdp::testing
