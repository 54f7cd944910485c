#include "kernels/cpu/matmul.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
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

// Rows [i0, i0 + mc) x columns [j0, j0 + nc) of one problem's out (and aux) from its product
// tile p (row stride ldp): the epilogue in double, rounded once to O.
template <typename T, typename O>
void store_tile(const MatmulDims& d, const Epilogue& e, const T* p, int64_t ldp, int64_t i0,
                int64_t j0, int64_t mc, int64_t nc, O* ob, O* xb, const O* bias) {
  for (int64_t i = 0; i < mc; ++i) {
    for (int64_t j = 0; j < nc; ++j) {
      const int64_t o = (i0 + i) * d.n + j0 + j;
      double v = e.alpha * double(p[i * ldp + j]);
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

template <typename T, typename O>
void blocked_typed(const MatmulDims& d, O* out, const T* a, const T* b, const Epilogue& e,
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
      store_tile(d, e, ctile.data(), kNC, i0, j0, mc, nc, out + bi * d.batch_stride_out,
                 aux ? aux + bi * d.batch_stride_out : nullptr, bias);
    }
  }
}

// ---- OpenBLAS ----------------------------------------------------------------------------
//
// The output is cut into fixed tiles, spread over our OpenMP threads as above, and each tile
// is one cblas_?gemm call over the whole of K, run on the calling thread alone. OpenBLAS's
// own threading is not used: it splits the output by thread count, and its kernels round an
// element differently depending on where it falls in their register blocks (a row computed
// alone differs from the same row inside a larger product), so its results would depend on
// the number of threads; a fixed tile grid makes them depend on the shape only.
//
// Tiles this large keep each call's packing (repeated per tile) a small part of its work: the
// output head's three products (512 x 50304 x 128 and its gradients) run at 136-169 GFLOP/s
// on two threads with them, about what OpenBLAS's own threading reaches; 128 x 512 tiles lost
// up to a fifth on the forward product. 512-row tiles would leave a 512-row product (the
// quickstart's micro-batch) as one tile on one thread.
constexpr int64_t kBlasMC = 256, kBlasNC = 1024;

CBLAS_TRANSPOSE blas_trans(bool t) { return t ? CblasTrans : CblasNoTrans; }

// c (mc, nc; row stride ldc) = op(a) @ op(b) for the tile whose first row of op(a) and first
// column of op(b) start at a and b.
void gemm(const MatmulDims& d, int64_t mc, int64_t nc, const float* a, const float* b,
          float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, blas_trans(d.trans_a), blas_trans(d.trans_b), int(mc), int(nc),
              int(d.k), 1.0f, a, int(d.lda()), b, int(d.ldb()), 0.0f, c, int(ldc));
}

void gemm(const MatmulDims& d, int64_t mc, int64_t nc, const double* a, const double* b,
          double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, blas_trans(d.trans_a), blas_trans(d.trans_b), int(mc), int(nc),
              int(d.k), 1.0, a, int(d.lda()), b, int(d.ldb()), 0.0, c, int(ldc));
}

// Whether OpenBLAS can take the problem: its sizes are 32-bit ints, and K = 0 would make a
// leading dimension 0, which it rejects (the hand-written kernel handles both).
bool blas_fits(const MatmulDims& d) {
  const int64_t most = std::numeric_limits<int>::max();
  return d.k > 0 && d.k <= most && d.lda() <= most && d.ldb() <= most && d.n <= most;
}

template <typename T, typename O>
void blas_typed(const MatmulDims& d, O* out, const T* a, const T* b, const Epilogue& e,
                const O* bias, O* aux) {
  const int64_t mtiles = (d.m + kBlasMC - 1) / kBlasMC, ntiles = (d.n + kBlasNC - 1) / kBlasNC;
  const int64_t tiles = d.batch * mtiles * ntiles;
  const double flops = 2.0 * double(d.m) * double(d.n) * double(d.k) * double(d.batch);
  // With nothing to scale, add or round, the product goes straight into out; otherwise into a
  // tile of T, then through the epilogue.
  constexpr bool same_type = std::is_same<T, O>::value;
  const bool direct =
      same_type && e.alpha == 1.0 && e.beta == 0.0 && !bias && e.kind == MatmulEpilogue::None;
#pragma omp parallel if (flops > 4e6)
  {
    // OpenBLAS's OpenMP build runs a call on as many threads as the calling thread's
    // nthreads setting (omp_get_max_threads) says, or on one inside an active parallel
    // region; this region is not active when it has one thread or too few flops. 1 keeps
    // every call on its own thread. The setting is this region's (its implicit task's): it
    // ends with the region and the caller's is untouched.
    omp_set_num_threads(1);
    std::vector<T> tile(direct ? 0 : size_t(std::min(kBlasMC, d.m) * std::min(kBlasNC, d.n)));
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t bi = t / (mtiles * ntiles), mt = (t / ntiles) % mtiles, nt = t % ntiles;
      const int64_t i0 = mt * kBlasMC, j0 = nt * kBlasNC;
      const int64_t mc = std::min(kBlasMC, d.m - i0), nc = std::min(kBlasNC, d.n - j0);
      // Row i0 of op(a) is column i0 of a transposed a; column j0 of op(b) is row j0 of a
      // transposed b.
      const T* at = a + bi * d.batch_stride_a + (d.trans_a ? i0 : i0 * d.lda());
      const T* bt = b + bi * d.batch_stride_b + (d.trans_b ? j0 * d.ldb() : j0);
      O* ob = out + bi * d.batch_stride_out;
      if constexpr (same_type) {
        if (direct) {
          gemm(d, mc, nc, at, bt, ob + i0 * d.n + j0, d.n);
          continue;
        }
      }
      gemm(d, mc, nc, at, bt, tile.data(), nc);
      store_tile(d, e, tile.data(), nc, i0, j0, mc, nc, ob,
                 aux ? aux + bi * d.batch_stride_out : nullptr, bias);
    }
  }
}

// The product with the chosen implementation, for the supported dtype pairs.
template <typename T, typename O>
void run_typed(bool blas, const MatmulDims& d, void* out, const void* a, const void* b,
               const Epilogue& e, const void* bias, void* aux) {
  O* o = static_cast<O*>(out);
  const T* ta = static_cast<const T*>(a);
  const T* tb = static_cast<const T*>(b);
  const O* ob = static_cast<const O*>(bias);
  O* x = static_cast<O*>(aux);
  if (blas)
    blas_typed<T, O>(d, o, ta, tb, e, ob, x);
  else
    blocked_typed<T, O>(d, o, ta, tb, e, ob, x);
}

void run(bool blas, const MatmulDims& dims, void* out, DType out_dtype, const void* a,
         const void* b, DType in_dtype, double alpha, double beta, const void* bias, void* aux,
         MatmulEpilogue epilogue) {
  if (dims.m == 0 || dims.n == 0 || dims.batch == 0) return;
  FSDP_CHECK(epilogue != MatmulEpilogue::BiasGrad, ValueError,
             "cpu matmul: the BiasGrad epilogue is CUDA's (ops::matmul_bias_grad sums the bias "
             "gradient separately on the CPU)");
  const Epilogue e{alpha, beta, epilogue};
  blas = blas && blas_fits(dims);
  if (in_dtype == DType::f32 && out_dtype == DType::f32) {
    run_typed<float, float>(blas, dims, out, a, b, e, bias, aux);
  } else if (in_dtype == DType::f32 && out_dtype == DType::f64) {
    run_typed<float, double>(blas, dims, out, a, b, e, bias, aux);
  } else if (in_dtype == DType::f64 && out_dtype == DType::f64) {
    run_typed<double, double>(blas, dims, out, a, b, e, bias, aux);
  } else {
    FSDP_THROW(DTypeError, "cpu matmul: inputs ", dtype_name(in_dtype), " with output ",
               dtype_name(out_dtype), " is not supported (f32/f64 in, same or wider out)");
  }
}

}  // namespace

bool matmul_uses_openblas() {
  // 2: the OpenMP build (0 is the sequential one, 1 the pthreads one). Only it runs a call
  // on the calling thread alone when asked to, without global settings, and shares libgomp's
  // threads instead of starting its own pool beside them (a second pool of spinning threads
  // on cores that several ranks already share). //third_party/openblas links it.
  return openblas_get_parallel() == 2;
}

void matmul(const MatmulDims& dims, void* out, DType out_dtype, const void* a, const void* b,
            DType in_dtype, double alpha, double beta, const void* bias, void* aux,
            MatmulEpilogue epilogue) {
  run(matmul_uses_openblas(), dims, out, out_dtype, a, b, in_dtype, alpha, beta, bias, aux,
      epilogue);
}

void blocked_matmul(const MatmulDims& dims, void* out, DType out_dtype, const void* a,
                    const void* b, DType in_dtype, double alpha, double beta, const void* bias,
                    void* aux, MatmulEpilogue epilogue) {
  run(false, dims, out, out_dtype, a, b, in_dtype, alpha, beta, bias, aux, epilogue);
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
