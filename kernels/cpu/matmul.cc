#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/float_types.h"
#include "kernels/scalar_math.h"
#include "runtime/core/error.h"

namespace fsdp::kernels::cpu {
namespace {

// 32-byte vectors: 8 floats or 4 doubles. The inner kernel computes an (kMR x 2 vectors)
// block of the output, i.e. 6 x 16 floats or 6 x 8 doubles, in 12 registers.
template <typename T> struct Simd;
template <> struct Simd<float> {
  typedef float V __attribute__((vector_size(32)));
  static constexpr int kLanes = 8;
};
template <> struct Simd<double> {
  typedef double V __attribute__((vector_size(32)));
  static constexpr int kLanes = 4;
};

constexpr int64_t kMR = 6;                   // rows of op(a) per inner-kernel call
template <typename T>
constexpr int64_t kNR = 2 * Simd<T>::kLanes;  // columns of op(b) per inner-kernel call
// A tile of the output is (kMC, kNC); K is consumed in slices of kKC. The packed A slice
// (kMC x kKC) and B slice (kKC x kNC) stay in L2, one B micro-panel (kKC x kNR) in L1.
constexpr int64_t kMC = 16 * kMR;  // 96
constexpr int64_t kNC = 128;
constexpr int64_t kKC = 256;

template <typename T>
using Vec = typename Simd<T>::V;

template <typename T>
[[gnu::always_inline]] inline Vec<T> load(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <typename T>
[[gnu::always_inline]] inline void store(T* p, Vec<T> v) {
  std::memcpy(p, &v, sizeof(v));
}

[[gnu::always_inline]] inline Vec<float> broadcast(float x) { return Vec<float>{x, x, x, x, x, x, x, x}; }
[[gnu::always_inline]] inline Vec<double> broadcast(double x) { return Vec<double>{x, x, x, x}; }

// c (kMR, kNR; row stride ldc) += ap (kc, kMR) as columns times bp (kc, kNR).
template <typename T>
[[gnu::always_inline]] inline void inner_kernel(int64_t kc, const T* ap, const T* bp, T* c,
                                                int64_t ldc) {
  constexpr int L = Simd<T>::kLanes;
  Vec<T> acc[kMR][2];
  for (int r = 0; r < kMR; ++r) acc[r][0] = acc[r][1] = Vec<T>{};
  for (int64_t p = 0; p < kc; ++p) {
    const Vec<T> b0 = load(bp + p * kNR<T>), b1 = load(bp + p * kNR<T> + L);
#pragma GCC unroll 6
    for (int r = 0; r < kMR; ++r) {
      const Vec<T> a = broadcast(ap[p * kMR + r]);
      acc[r][0] += a * b0;
      acc[r][1] += a * b1;
    }
  }
  for (int r = 0; r < kMR; ++r) {
    store(c + r * ldc, load(c + r * ldc) + acc[r][0]);
    store(c + r * ldc + L, load(c + r * ldc + L) + acc[r][1]);
  }
}

// ctile (kMC, kNC) += packed A slice times packed B slice, over mblocks x nblocks inner blocks.
template <typename T>
[[gnu::always_inline]] inline void slice_product(int64_t mblocks, int64_t nblocks, int64_t kc,
                                                 const T* apack, const T* bpack, T* ctile) {
  for (int64_t jb = 0; jb < nblocks; ++jb)
    for (int64_t ib = 0; ib < mblocks; ++ib)
      inner_kernel<T>(kc, apack + ib * kc * kMR, bpack + jb * kc * kNR<T>,
                      ctile + ib * kMR * kNC + jb * kNR<T>, kNC);
}

// One compiled body per instruction set; the loader picks the best the CPU supports. The
// AVX2 body fuses multiply-adds (FMA), so results are reproducible on one machine (any
// thread count) but may differ in the last bit between CPUs with and without FMA.
__attribute__((target_clones("avx2,fma", "default"))) void slice_product_f32(
    int64_t mblocks, int64_t nblocks, int64_t kc, const float* apack, const float* bpack,
    float* ctile) {
  slice_product<float>(mblocks, nblocks, kc, apack, bpack, ctile);
}

__attribute__((target_clones("avx2,fma", "default"))) void slice_product_f64(
    int64_t mblocks, int64_t nblocks, int64_t kc, const double* apack, const double* bpack,
    double* ctile) {
  slice_product<double>(mblocks, nblocks, kc, apack, bpack, ctile);
}

inline void slice_product_any(int64_t mb, int64_t nb, int64_t kc, const float* a, const float* b,
                              float* c) {
  slice_product_f32(mb, nb, kc, a, b, c);
}
inline void slice_product_any(int64_t mb, int64_t nb, int64_t kc, const double* a,
                              const double* b, double* c) {
  slice_product_f64(mb, nb, kc, a, b, c);
}

// Packs rows [i0, i0 + mc) x columns [p0, p0 + kc) of op(a) as kMR-row micro-panels, each
// stored column by column (kc, kMR); rows past mc are zero.
template <typename T>
void pack_a(const MatmulDims& d, const T* a, int64_t i0, int64_t mc, int64_t p0, int64_t kc,
            T* dst) {
  const int64_t lda = d.lda();
  for (int64_t ib = 0; ib * kMR < mc; ++ib) {
    T* panel = dst + ib * kc * kMR;
    for (int64_t r = 0; r < kMR; ++r) {
      const int64_t i = ib * kMR + r;
      if (i >= mc) {
        for (int64_t p = 0; p < kc; ++p) panel[p * kMR + r] = T(0);
      } else if (d.trans_a) {  // op(a)(i, p) = a[p, i]
        for (int64_t p = 0; p < kc; ++p) panel[p * kMR + r] = a[(p0 + p) * lda + i0 + i];
      } else {
        const T* row = a + (i0 + i) * lda + p0;
        for (int64_t p = 0; p < kc; ++p) panel[p * kMR + r] = row[p];
      }
    }
  }
}

// Packs rows [p0, p0 + kc) x columns [j0, j0 + nc) of op(b) as kNR-column micro-panels,
// each stored row by row (kc, kNR); columns past nc are zero.
template <typename T>
void pack_b(const MatmulDims& d, const T* b, int64_t p0, int64_t kc, int64_t j0, int64_t nc,
            T* dst) {
  constexpr int64_t NR = kNR<T>;
  const int64_t ldb = d.ldb();
  for (int64_t jb = 0; jb * NR < nc; ++jb) {
    T* panel = dst + jb * kc * NR;
    const int64_t width = std::min(NR, nc - jb * NR);
    for (int64_t p = 0; p < kc; ++p) {
      T* out = panel + p * NR;
      if (d.trans_b) {  // op(b)(p, j) = b[j, p]
        for (int64_t c = 0; c < width; ++c) out[c] = b[(j0 + jb * NR + c) * ldb + p0 + p];
      } else {
        const T* row = b + (p0 + p) * ldb + j0 + jb * NR;
        for (int64_t c = 0; c < width; ++c) out[c] = row[c];
      }
      for (int64_t c = width; c < NR; ++c) out[c] = T(0);
    }
  }
}

struct Epilogue {
  double alpha, beta;
  MatmulEpilogue kind;
};

template <typename T, typename O>
void matmul_typed(const MatmulDims& d, O* out, const T* a, const T* b, const Epilogue& e,
                  const O* bias, O* aux) {
  const int64_t mtiles = (d.m + kMC - 1) / kMC, ntiles = (d.n + kNC - 1) / kNC;
  const int64_t tiles = d.batch * mtiles * ntiles;
  const double flops = 2.0 * double(d.m) * double(d.n) * double(d.k) * double(d.batch);
  // Threads only pay off past a few million flops; the result does not depend on them.
#pragma omp parallel if (flops > 4e6)
  {
    std::vector<T> apack(size_t(kMC * kKC)), bpack(size_t(kKC * kNC)), ctile(size_t(kMC * kNC));
    // Dynamic: a tile's result does not depend on which thread computes it, and a busy
    // (shared) machine does not leave one thread waiting on a descheduled one.
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t bi = t / (mtiles * ntiles), mt = (t / ntiles) % mtiles, nt = t % ntiles;
      const int64_t i0 = mt * kMC, j0 = nt * kNC;
      const int64_t mc = std::min(kMC, d.m - i0), nc = std::min(kNC, d.n - j0);
      const T* ab = a + bi * d.batch_stride_a;
      const T* bb = b + bi * d.batch_stride_b;
      std::fill(ctile.begin(), ctile.end(), T(0));
      for (int64_t p0 = 0; p0 < d.k; p0 += kKC) {
        const int64_t kc = std::min(kKC, d.k - p0);
        pack_a(d, ab, i0, mc, p0, kc, apack.data());
        pack_b(d, bb, p0, kc, j0, nc, bpack.data());
        slice_product_any((mc + kMR - 1) / kMR, (nc + kNR<T> - 1) / kNR<T>, kc, apack.data(),
                          bpack.data(), ctile.data());
      }
      O* ob = out + bi * d.batch_stride_out;
      O* xb = aux ? aux + bi * d.batch_stride_out : nullptr;
      for (int64_t i = 0; i < mc; ++i) {
        for (int64_t j = 0; j < nc; ++j) {
          const int64_t o = (i0 + i) * d.n + j0 + j;
          double v = e.alpha * double(ctile[size_t(i * kNC + j)]);
          if (e.beta != 0.0) v += e.beta * double(ob[o]);
          if (bias) v += double(bias[j0 + j]);
          if (e.kind == MatmulEpilogue::Gelu) {
            if (xb) xb[o] = O(v);
            v = gelu_tanh(double(O(v)));  // from the stored pre-activation, as backward sees it
          } else if (e.kind == MatmulEpilogue::DGelu) {
            v *= gelu_tanh_grad(double(xb[o]));
          }
          ob[o] = O(v);
        }
      }
    }
  }
}

}  // namespace

void matmul(const MatmulDims& dims, void* out, DType out_dtype, const void* a, const void* b,
            DType in_dtype, double alpha, double beta, const void* bias, void* aux,
            MatmulEpilogue epilogue) {
  if (dims.m == 0 || dims.n == 0 || dims.batch == 0) return;
  FSDP_CHECK(epilogue != MatmulEpilogue::BiasGrad, ValueError,
             "cpu matmul: the BiasGrad epilogue is CUDA's (ops::matmul_bias_grad sums the bias "
             "gradient separately on the CPU)");
  const Epilogue e{alpha, beta, epilogue};
  if (in_dtype == DType::f32 && out_dtype == DType::f32) {
    matmul_typed<float, float>(dims, static_cast<float*>(out), static_cast<const float*>(a),
                               static_cast<const float*>(b), e, static_cast<const float*>(bias),
                               static_cast<float*>(aux));
  } else if (in_dtype == DType::f32 && out_dtype == DType::f64) {
    matmul_typed<float, double>(dims, static_cast<double*>(out), static_cast<const float*>(a),
                                static_cast<const float*>(b), e,
                                static_cast<const double*>(bias), static_cast<double*>(aux));
  } else if (in_dtype == DType::f64 && out_dtype == DType::f64) {
    matmul_typed<double, double>(dims, static_cast<double*>(out), static_cast<const double*>(a),
                                 static_cast<const double*>(b), e,
                                 static_cast<const double*>(bias), static_cast<double*>(aux));
  } else {
    FSDP_THROW(DTypeError, "cpu matmul: inputs ", dtype_name(in_dtype), " with output ",
               dtype_name(out_dtype), " is not supported (f32/f64 in, same or wider out)");
  }
}

void bias_backward(void* dbias, DType grad_dtype, const void* dout, DType dtype, int64_t m,
                   int64_t n, bool accumulate) {
  dispatch_compute(dtype, "bias_backward", [&](auto ttag) {
    using T = decltype(ttag);
    dispatch_compute(grad_dtype, "bias_backward gradient", [&](auto gtag) {
      using G = decltype(gtag);
      const T* g = static_cast<const T*>(dout);
      std::vector<double> sums(size_t(n), 0.0);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) sums[size_t(j)] += double(g[i * n + j]);
      G* db = static_cast<G*>(dbias);
      for (int64_t j = 0; j < n; ++j) store_or_add(db[j], sums[size_t(j)], accumulate);
    });
  });
}

}  // namespace fsdp::kernels::cpu
