// cuBLASLt matmuls for one CUDA context: the handle, a 64 MiB workspace, and one plan
// (descriptors and the heuristic's algorithm) cached per problem shape. A Context
// extension: ctx.extension<kernels::cuda::Blas>().
//
// Row-major problems map onto cuBLASLt's column-major convention by swapping operands: the
// row-major (M, N) output is the column-major (N, M) matrix out^T = op(b)^T op(a)^T, so
// cuBLASLt is called with A := b, B := a and m := N, n := M. The bias of length N is then
// cuBLASLt's per-row bias, as its epilogues expect.
#pragma once

#include <memory>
#include <vector>

#include "kernels/cuda/basic.h"
#include "kernels/fp8_format.h"
#include "kernels/nn_shapes.h"
#include "runtime/core/context.h"

namespace fsdp::kernels::cuda {

// Choosing each problem's algorithm by timing. cuBLASLt's heuristic ranks its candidates by
// a model, and on the H200 its first choice runs up to 1.25x slower than the fastest of its
// top 8 for some training shapes (GPT-2's bias forwards and projections). With tuning on, a
// problem's candidates are timed on its own operands the `after_uses`-th time it runs
// (outside CUDA-graph capture; an output that accumulates, beta != 0, is put back
// afterwards, so the call's result is what an untuned call gives), and the fastest is kept
// for the rest of the run. A problem is tuned once; at most `max_tuned` are, which bounds
// the cost for the experts of a mixture-of-experts layer, whose row counts keep changing.
struct MatmulTuning {
  bool enabled = false;
  int candidates = 8;      // the heuristic's top candidates timed
  int after_uses = 2;      // a shape seen once only is not worth timing
  int timed_runs = 3;      // after one warm-up run of each candidate
  size_t max_tuned = 512;
  // FP8 plans too (their alpha and beta on the device; false keeps the heuristic's choice
  // for them, as before they could be timed).
  bool fp8 = true;
};

// What tuning found for one problem (bench and tests read these).
struct MatmulTuningRecord {
  MatmulDims dims;
  DType in, out;
  MatmulEpilogue epilogue;
  bool bias;
  bool fp8;              // FP8 operands (in: the output's dtype)
  int candidates;        // timed (those that ran)
  int chosen;            // index among the heuristic's candidates (0 = its first choice)
  double heuristic_ms;   // the first choice, one run
  double best_ms;        // the chosen one, one run
};

class Blas {
 public:
  explicit Blas(Context& ctx);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // As kernels::cpu::matmul, on ctx's current stream. Inputs bf16 or f32; out the input
  // dtype, or f32 for bf16 inputs (beta = 1 accumulates weight gradients in f32). bias and
  // aux have the output dtype. f32 accumulation always.
  void matmul(const MatmulDims& dims, void* out, DType out_dtype, const void* a, const void* b,
              DType in_dtype, double alpha, double beta, const void* bias, void* aux,
              MatmulEpilogue epilogue);

  // With MatmulEpilogue::BiasGrad, `aux` (M floats) receives the sums over K of op(a).
  // Returns false, having done nothing, when cuBLASLt has no algorithm for that epilogue
  // with this problem (the caller sums the bias gradient itself); true otherwise.
  bool try_matmul(const MatmulDims& dims, void* out, DType out_dtype, const void* a,
                  const void* b, DType in_dtype, double alpha, double beta, const void* bias,
                  void* aux, MatmulEpilogue epilogue);

  // FP8: out (M, N) = alpha * sa * sb * a (M, K) @ b (N, K)^T + beta * out [+ bias]
  // [Gelu, aux: the pre-activation | DGelu, aux read], with a and b FP8 bytes in the given
  // formats (not both e5m2) and sa, sb their inverse scales, f32 on the device. out, bias
  // and aux bf16 or f32; f32 accumulation, or Hopper's fast accumulation when fast_accum.
  // Returns false, having done nothing, when cuBLASLt has no FP8 algorithm for the problem
  // (sizes not multiples of 16, or an epilogue its FP8 kernels lack).
  bool try_fp8_matmul(int64_t m, int64_t n, int64_t k, void* out, DType out_dtype, const void* a,
                      Fp8Format format_a, const float* scale_inv_a, const void* b,
                      Fp8Format format_b, const float* scale_inv_b, double alpha, double beta,
                      const void* bias, void* aux, MatmulEpilogue epilogue, bool fast_accum);

  // Block-scaled FP8 (the blockwise recipe): out (M, N) = alpha * a (M, K) @ b (N, K)^T +
  // beta * out [+ bias], each operand dequantized by its blocks' inverse scales scale_a and
  // scale_b (f32 on the device, laid out as kernels/fp8_format.h's fp8_scale_grid says:
  // cuBLASLt's VEC128_32F for 1x128, BLK128x128_32F for 128x128); not both 128x128. out and
  // bias bf16 or f32; no other epilogue and no fast accumulation (cuBLASLt's block-scaled
  // kernels promote every block of K to f32). Returns false, having done nothing, when
  // cuBLASLt has no algorithm for the problem (sizes not multiples of 16, K not a multiple of
  // 128, or a GPU without block-scaled FP8 kernels: they exist for Hopper, sm_90). Row
  // scaling (the rowwise recipe) takes the same path: both operands row-scaled (one f32 per
  // row: cuBLASLt's OUTER_VEC_32F), K a multiple of 16.
  bool try_fp8_block_matmul(int64_t m, int64_t n, int64_t k, void* out, DType out_dtype,
                            const void* a, Fp8Format format_a, Fp8Granularity granularity_a,
                            const float* scale_a, const void* b, Fp8Format format_b,
                            Fp8Granularity granularity_b, const float* scale_b, double alpha,
                            double beta, const void* bias);

  // Tuning is off until set (the trainer sets it from train.matmul_tuning).
  void set_tuning(const MatmulTuning& tuning);
  const MatmulTuning& tuning() const;
  // Every problem tuned so far, in the order tuned.
  const std::vector<MatmulTuningRecord>& tuning_records() const;

  // Number of problem shapes whose plans are cached (for tests of the cache). The cache
  // keeps at most kMaxCachedPlans: the experts of a mixture-of-experts layer get new row
  // counts every step, so their shapes never stop coming; the least recently used half
  // goes when it is full.
  size_t cached_plans() const;
  static constexpr size_t kMaxCachedPlans = 1024;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A linear layer's weight and bias gradients from one matmul (ops::matmul_bias_grad's CUDA
// path): dw as Blas::matmul, and dbias (M) of dbias_dtype (bf16 or f32; += when accumulate)
// the sums over K of op(a), from cuBLASLt's BGRADB epilogue. BGRADB writes f32 sums: straight
// into an f32 dbias that is not accumulated, else into M floats of scratch then added.
// Returns false, having queued nothing, when cuBLASLt has no BGRADB algorithm for the
// problem (the caller then runs the matmul and sums the bias gradient itself).
bool matmul_bias_grad(Blas& blas, const MatmulDims& dims, void* dw, DType dw_dtype, const void* a,
                      const void* b, DType in_dtype, double alpha, double beta, void* dbias,
                      DType dbias_dtype, bool accumulate, const Scratch& scratch,
                      stream_t stream);

}  // namespace fsdp::kernels::cuda
