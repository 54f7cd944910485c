// Element-type dispatch for the CPU reference kernels.
//
// The transformer kernels compute in f32 or f64 ("compute" types). Parameter gradients are
// f32 or f64 too, independently of the compute type. The optimizer and the initializer also
// read and write the 16-bit types. Everything is computed in double and rounded once when
// stored (to_double / from_double from runtime/core/dtype.h).
#pragma once

#include "runtime/core/dtype.h"
#include "runtime/core/error.h"

namespace fsdp::kernels::cpu {

// f(float{}) or f(double{}).
template <typename F>
void dispatch_compute(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    default:
      FSDP_THROW(DTypeError, what, ": the CPU computes in f32 or f64, got ", dtype_name(t));
  }
}

// Any floating type, 16-bit ones included.
template <typename F>
void dispatch_any_floating(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    case DType::bf16: f(bf16{}); return;
    case DType::f16: f(f16{}); return;
    default: FSDP_THROW(DTypeError, what, ": floating dtype expected, got ", dtype_name(t));
  }
}

// Stores `v` into `dst`, adding to what is there when `accumulate`.
template <typename T>
inline void store_or_add(T& dst, double v, bool accumulate) {
  dst = from_double<T>(accumulate ? to_double(dst) + v : v);
}

}  // namespace fsdp::kernels::cpu
