#include "kernels/cpu/newton_schulz.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "kernels/cpu/float_types.h"
#include "kernels/cpu/matmul.h"

namespace fsdp::kernels::cpu {
namespace {

// out = alpha * op(a) @ op(b) + beta * out, (m, n) from (m, k) and (k, n) (b transposed when
// trans_b), all of the work type W.
template <typename W>
void product(std::vector<W>& out, const std::vector<W>& a, const std::vector<W>& b, int64_t m,
             int64_t n, int64_t k, bool trans_b, double alpha, double beta) {
  MatmulDims d;
  d.m = m;
  d.n = n;
  d.k = k;
  d.trans_b = trans_b;
  const DType t = dtype_of<W>();
  matmul(d, out.data(), t, a.data(), b.data(), t, alpha, beta, nullptr, nullptr, MatmulEpilogue::None);
}

// One matrix: x (rows, cols) of X into out of O, computed in W.
template <typename W, typename X, typename O>
void orthogonalize(const NewtonSchulzDims& d, const X* x, O* out, const NewtonSchulzScalars& s) {
  const int64_t m = d.short_side(), n = d.long_side();
  std::vector<W> cur(size_t(m * n)), next(size_t(m * n)), gram(size_t(m * m)), poly(size_t(m * m));
  // The wide orientation (m, n): a tall matrix is read transposed. Its norm in double.
  double squares = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const W v = W(to_double(d.tall() ? x[j * d.cols + i] : x[i * d.cols + j]));
      cur[size_t(i * n + j)] = v;
      squares += double(v) * double(v);
    }
  const W norm = std::max(W(std::sqrt(squares)), W(s.eps));
  for (W& v : cur) v = v / norm;
  for (int step = 0; step < s.steps; ++step) {
    product(gram, cur, cur, m, m, n, /*trans_b=*/true, 1.0, 0.0);  // A = X X^T (m, m)
    poly = gram;
    product(poly, gram, gram, m, m, m, false, s.c, s.b);           // b A + c A A
    next = cur;
    product(next, poly, cur, m, n, m, false, 1.0, s.a);            // a X + B X (m, n)
    std::swap(cur, next);
  }
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const double v = double(cur[size_t(i * n + j)]);
      (d.tall() ? out[j * d.cols + i] : out[i * d.cols + j]) = from_double<O>(v);
    }
}

}  // namespace

void newton_schulz(const NewtonSchulzDims& d, const void* x, DType x_dtype, void* out,
                   DType out_dtype, const NewtonSchulzScalars& s) {
  dispatch_any_floating(x_dtype, "newton_schulz input", [&](auto xtag) {
    using X = decltype(xtag);
    dispatch_any_floating(out_dtype, "newton_schulz output", [&](auto otag) {
      using O = decltype(otag);
      const int64_t size = d.rows * d.cols;
      for (int64_t b = 0; b < d.batch; ++b) {
        const X* xb = static_cast<const X*>(x) + b * size;
        O* ob = static_cast<O*>(out) + b * size;
        if (x_dtype == DType::f64)
          orthogonalize<double>(d, xb, ob, s);
        else
          orthogonalize<float>(d, xb, ob, s);
      }
    });
  });
}

}  // namespace fsdp::kernels::cpu
