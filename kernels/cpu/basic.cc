#include "kernels/cpu/basic.h"

#include <cmath>
#include <limits>

#include "runtime/core/error.h"

namespace fsdp::kernels::cpu {
namespace {

// Floating element types are computed in float, except double in double.
template <typename T> struct Compute { using type = float; };
template <> struct Compute<double> { using type = double; };

template <typename T>
inline typename Compute<T>::type load(const T& v) {
  return static_cast<typename Compute<T>::type>(v);
}
template <typename T, typename C>
inline T store(C v) {
  return static_cast<T>(v);
}
template <> inline bf16 store<bf16, float>(float v) { return bf16(v); }
template <> inline f16 store<f16, float>(float v) { return f16(v); }

// Converts any element type to any other through double: exact for every floating type
// (the double then rounds once, to nearest even, into the narrower type) and for integers
// below 2^53. Floats to integers truncate toward zero.
template <typename D, typename S>
inline D convert(const S& s) {
  return from_double<D>(to_double(s));
}

template <typename F>
void dispatch_floating(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    case DType::bf16: f(bf16{}); return;
    case DType::f16: f(f16{}); return;
    default: FSDP_THROW(DTypeError, what, ": floating dtype expected, got ", dtype_name(t));
  }
}

}  // namespace

void fill(void* out, DType dtype, const StridedLayout& layout, double value) {
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T v = from_double<T>(value);
    T* o = static_cast<T*>(out);
    const int64_t n = layout.numel();
    for (int64_t i = 0; i < n; ++i) o[layout.offset_of(i)] = v;
  });
}

void copy(void* dst, DType dst_dtype, const StridedLayout& dst_layout, const void* src,
          DType src_dtype, const StridedLayout& src_layout) {
  const int64_t n = dst_layout.numel();
  FSDP_ASSERT(n == src_layout.numel());
  dispatch_dtype(dst_dtype, [&](auto dtag) {
    using D = decltype(dtag);
    dispatch_dtype(src_dtype, [&](auto stag) {
      using S = decltype(stag);
      D* d = static_cast<D*>(dst);
      const S* s = static_cast<const S*>(src);
      for (int64_t i = 0; i < n; ++i)
        d[dst_layout.offset_of(i)] = convert<D>(s[src_layout.offset_of(i)]);
    });
  });
}

void binary(BinaryOp op, void* out, const void* a, const void* b, int64_t n, DType dtype,
            DType b_dtype) {
  dispatch_floating(dtype, "binary", [&](auto tag) {
    using T = decltype(tag);
    dispatch_floating(b_dtype, "binary", [&](auto btag) {
      using U = decltype(btag);
      T* o = static_cast<T*>(out);
      const T* x = static_cast<const T*>(a);
      const U* y = static_cast<const U*>(b);
      for (int64_t i = 0; i < n; ++i) {
        // b is read in a's precision (the wider of the two where they differ).
        const auto u = load(x[i]);
        const decltype(u) v = load(y[i]);
        const auto r = op == BinaryOp::Add ? u + v : op == BinaryOp::Sub ? u - v : u * v;
        o[i] = store<T>(r);
      }
    });
  });
}

void scale(void* out, const void* a, double s, int64_t n, DType dtype) {
  dispatch_floating(dtype, "scale", [&](auto tag) {
    using T = decltype(tag);
    using C = typename Compute<T>::type;
    T* o = static_cast<T*>(out);
    const T* x = static_cast<const T*>(a);
    const C sc = static_cast<C>(s);
    for (int64_t i = 0; i < n; ++i) o[i] = store<T>(sc * load(x[i]));
  });
}

void axpby(void* y, DType y_dtype, const void* x, DType x_dtype, double alpha, double beta,
           int64_t n) {
  dispatch_floating(y_dtype, "axpby", [&](auto ytag) {
    using Y = decltype(ytag);
    dispatch_floating(x_dtype, "axpby", [&](auto xtag) {
      using X = decltype(xtag);
      // Computed in the wider of the two compute types.
      using C = std::conditional_t<std::is_same_v<X, double> || std::is_same_v<Y, double>,
                                   double, float>;
      Y* yy = static_cast<Y*>(y);
      const X* xx = static_cast<const X*>(x);
      const C a = static_cast<C>(alpha), b = static_cast<C>(beta);
      for (int64_t i = 0; i < n; ++i) {
        const C xi = static_cast<C>(load(xx[i]));
        // beta == 0 must not propagate NaN/Inf from uninitialized y.
        const C r = beta == 0.0 ? a * xi : a * xi + b * static_cast<C>(load(yy[i]));
        yy[i] = store<Y>(r);
      }
    });
  });
}

double reduce(ReduceKind kind, const void* x, DType dtype, int64_t n) {
  double acc = 0;
  dispatch_floating(dtype, "reduce", [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x);
    switch (kind) {
      case ReduceKind::Sum:
        for (int64_t i = 0; i < n; ++i) acc += to_double(p[i]);
        break;
      case ReduceKind::SumSquares:
        for (int64_t i = 0; i < n; ++i) {
          const double v = to_double(p[i]);
          acc += v * v;
        }
        break;
      case ReduceKind::Max:
      case ReduceKind::Min:
      case ReduceKind::MaxAbs: {
        if (n == 0) {
          acc = std::numeric_limits<double>::quiet_NaN();
          break;
        }
        acc = kind == ReduceKind::MaxAbs ? 0.0 : to_double(p[0]);
        for (int64_t i = 0; i < n; ++i) {
          const double v = to_double(p[i]);
          if (std::isnan(v)) {  // NaN wins, so a diverged tensor is never hidden
            acc = v;
            break;
          }
          if (kind == ReduceKind::Max) acc = std::max(acc, v);
          if (kind == ReduceKind::Min) acc = std::min(acc, v);
          if (kind == ReduceKind::MaxAbs) acc = std::max(acc, std::fabs(v));
        }
        break;
      }
    }
  });
  return acc;
}

}  // namespace fsdp::kernels::cpu
