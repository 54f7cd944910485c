#include "kernels/cuda/matmul.h"

#include <cublasLt.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <tuple>
#include <vector>

#include "kernels/cuda/activation.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/library_check.h"

namespace fsdp::kernels::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(64) << 20;

cudaDataType_t fp8_cuda_type(Fp8Format f) {
  return f == Fp8Format::e4m3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: FSDP_THROW(DTypeError, "matmul (cuBLASLt): unsupported dtype ", dtype_name(t));
  }
}

// Largest power of two (up to 16) dividing the address: cuBLASLt picks kernels by it.
int alignment(const void* p) {
  if (!p) return 16;
  const auto a = reinterpret_cast<uintptr_t>(p);
  int r = 1;
  while (r < 16 && a % (2 * r) == 0) r *= 2;
  return r;
}

// Everything that decides the descriptors and the algorithm of a matmul.
struct PlanKey {
  MatmulDims d;
  DType in, out;
  bool bias;
  MatmulEpilogue epilogue;
  bool aux;
  int align_a, align_b, align_out, align_bias, align_aux;
  // FP8 inputs (then `in` is unused): 1 + 2 * format of a + format of b; 0 for bf16/f32.
  int fp8 = 0;
  bool fast_accum = false;  // FP8 only: Hopper's faster, less exact accumulation
  // Block-scaled FP8 only: the cublasLtMatmulMatrixScale_t of our a and of our b (0 =
  // tensor-wise, whose inverse scales ride in a device-side alpha instead).
  int scale_mode_a = 0, scale_mode_b = 0;

  auto tie() const {
    return std::make_tuple(d.m, d.n, d.k, d.trans_a, d.trans_b, d.batch, d.batch_stride_a,
                           d.batch_stride_b, d.batch_stride_out, int(in), int(out), bias,
                           int(epilogue), aux, align_a, align_b, align_out, align_bias, align_aux,
                           fp8, fast_accum, scale_mode_a, scale_mode_b);
  }
  bool block_scaled() const { return scale_mode_a != 0 || scale_mode_b != 0; }
  Fp8Format fp8_a() const { return Fp8Format(((fp8 - 1) >> 1) & 1); }
  Fp8Format fp8_b() const { return Fp8Format((fp8 - 1) & 1); }
  bool operator<(const PlanKey& o) const { return tie() < o.tie(); }
};

// A column-major matrix layout, optionally batched.
cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                                   int64_t batch, int64_t batch_stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  FSDP_CALL(cublasLtMatrixLayoutCreate(&layout, type, uint64_t(rows), uint64_t(cols), ld));
  if (batch > 1) {
    const int32_t count = int32_t(batch);
    FSDP_CALL(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                               sizeof(count)));
    FSDP_CALL(cublasLtMatrixLayoutSetAttribute(
        layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride, sizeof(batch_stride)));
  }
  return layout;
}

// One planned problem: the operation and layout descriptors and the chosen algorithm.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t lt_a = nullptr, lt_b = nullptr, lt_out = nullptr;
  cublasLtMatmulAlgo_t algo{};                   // the one every call runs
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's, its first choice first
  int uses = 0;
  bool tuned = false;  // timed (MatmulTuning), or nothing to choose from

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    // Destruction cannot report errors; the statuses are ignored on purpose.
    if (lt_out) cublasLtMatrixLayoutDestroy(lt_out);
    if (lt_b) cublasLtMatrixLayoutDestroy(lt_b);
    if (lt_a) cublasLtMatrixLayoutDestroy(lt_a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// The operands of one matmul call, as cuBLASLt takes them.
struct Operands {
  const float* alpha;  // host pointers, or device ones for FP8 plans (alpha and beta
  const float* beta;   // folded with the operands' scales on the device)
  const void* a;
  const void* b;
  void* out;
  void* workspace;
  CUstream_st* stream;
  bool accumulates;    // beta != 0: the output is read, so timing runs must put it back
};

}  // namespace

struct Blas::Impl {
  Context& ctx;
  cublasLtHandle_t handle = nullptr;
  std::map<CUstream_st*, Tensor> workspaces;  // one per stream: concurrent matmuls never share
  struct CachedPlan {
    std::unique_ptr<Plan> plan;  // null: cuBLASLt has no algorithm for the problem
    uint64_t last_use = 0;
  };
  std::map<PlanKey, CachedPlan> plans;
  uint64_t uses = 0;
  MatmulTuning tuning;
  std::vector<MatmulTuningRecord> tuned;

  explicit Impl(Context& c) : ctx(c) {
    DeviceGuard guard(ctx.device());
    FSDP_CALL(cublasLtCreate(&handle));
  }
  ~Impl() {
    plans.clear();
    if (handle) cublasLtDestroy(handle);
  }

  void* workspace(CUstream_st* stream) {
    auto it = workspaces.find(stream);
    if (it == workspaces.end()) {
      // Allocated while the stream is captured into a CUDA graph (train.cuda_graphs), the
      // workspace would be memory of that graph that every replay may overwrite: each
      // stream's workspace must exist before its first capture.
      cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
      FSDP_CALL(cudaStreamIsCapturing(stream, &capturing));
      FSDP_CHECK(capturing == cudaStreamCaptureStatusNone, CudaError,
                 "cuBLASLt: the first matmul on a stream is being captured into a CUDA graph; "
                 "its workspace must be created before the capture (run the work eagerly once)");
      it = workspaces.emplace(stream, ctx.empty(Shape{int64_t(kWorkspaceBytes)}, DType::u8)).first;
    }
    return it->second.data_ptr();
  }

  // The cached plan of `key`, made when missing; the least recently used half of the cache
  // is dropped first when it is full (a plan's descriptors are read only while a matmul is
  // enqueued, so dropping one never affects work already on a stream).
  // scale_a, scale_b: a block-scaled product's scale pointers (our a's and b's), which the
  // heuristic needs to see (it offers no algorithm for a scale mode without its pointer).
  Plan* find_or_make(const PlanKey& key, const void* bias, void* aux,
                     const float* scale_a = nullptr, const float* scale_b = nullptr) {
    auto it = plans.find(key);
    if (it == plans.end()) {
      if (plans.size() >= Blas::kMaxCachedPlans) drop_older_half();
      it = plans.emplace(key, CachedPlan{plan(key, bias, aux, scale_a, scale_b), 0}).first;
    }
    it->second.last_use = ++uses;
    return it->second.plan.get();
  }

  void drop_older_half() {
    std::vector<uint64_t> ages;
    ages.reserve(plans.size());
    for (const auto& [key, cached] : plans) ages.push_back(cached.last_use);
    auto middle = ages.begin() + std::ptrdiff_t(ages.size() / 2);
    std::nth_element(ages.begin(), middle, ages.end());
    const uint64_t cut = *middle;
    for (auto it = plans.begin(); it != plans.end();) {
      it = it->second.last_use < cut ? plans.erase(it) : std::next(it);
    }
  }

  // Builds the descriptors of `key` and asks the heuristic for its best algorithm.
  std::unique_ptr<Plan> plan(const PlanKey& key, const void* bias, void* aux,
                             const float* scale_a = nullptr, const float* scale_b = nullptr) {
    const MatmulDims& d = key.d;
    auto p = std::make_unique<Plan>();
    FSDP_CALL(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    // Row-major out (M, N) = op(a) op(b) is column-major out^T (N, M) = op(b)^T op(a)^T:
    // cuBLASLt's A is our b, its B is our a (see blas.h).
    const cublasOperation_t ta = d.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = d.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    FSDP_CALL(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    FSDP_CALL(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const bool gelu = key.epilogue == MatmulEpilogue::Gelu;
    if (key.epilogue == MatmulEpilogue::DGelu)
      epilogue = CUBLASLT_EPILOGUE_DGELU;  // reads the pre-activation from aux
    else if (key.epilogue == MatmulEpilogue::BiasGrad)
      epilogue = CUBLASLT_EPILOGUE_BGRADB;  // cuBLASLt's B is our a: sums over K of op(a)
    else if (gelu && key.aux)
      epilogue = key.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    else if (gelu)
      epilogue = key.bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    else if (key.bias)
      epilogue = CUBLASLT_EPILOGUE_BIAS;
    FSDP_CALL(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                             sizeof(epilogue)));
    if (key.epilogue == MatmulEpilogue::BiasGrad) {
      const cudaDataType_t f32 = CUDA_R_32F;
      FSDP_CALL(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &f32,
                                               sizeof(f32)));
    } else if (key.aux) {
      const int64_t ld = d.n;
      FSDP_CALL(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                               sizeof(ld)));
    }
    set_pointers(*p, bias, aux, key.epilogue == MatmulEpilogue::BiasGrad);
    const cudaDataType_t out = cuda_type(key.out);
    const cudaDataType_t in_a = key.fp8 ? fp8_cuda_type(key.fp8_b()) : cuda_type(key.in);
    const cudaDataType_t in_b = key.fp8 ? fp8_cuda_type(key.fp8_a()) : cuda_type(key.in);
    if (key.block_scaled()) {
      // Each operand's block scales come through its scale pointer (set per call); alpha
      // and beta stay on the host. cuBLASLt's A is our b, its B our a.
      const int32_t mode_a = key.scale_mode_b, mode_b = key.scale_mode_a;
      FSDP_CALL(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a,
                                               sizeof(mode_a)));
      FSDP_CALL(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b,
                                               sizeof(mode_b)));
      FSDP_CALL(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_b,
                                               sizeof(scale_b)));
      FSDP_CALL(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_a,
                                               sizeof(scale_a)));
    } else if (key.fp8) {
      // alpha and beta are read on the device: alpha carries the operands' inverse scales,
      // which never come back to the host.
      const cublasLtPointerMode_t mode = CUBLASLT_POINTER_MODE_DEVICE;
      FSDP_CALL(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode,
                                               sizeof(mode)));
      const int8_t fast = key.fast_accum ? 1 : 0;
      FSDP_CALL(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                               sizeof(fast)));
    }
    // Our b: (K, N) row-major = (N, K) column-major, ld N; transposed: stored (N, K), ld K.
    p->lt_a = d.trans_b ? make_layout(in_a, d.k, d.n, d.k, d.batch, d.batch_stride_b)
                        : make_layout(in_a, d.n, d.k, d.n, d.batch, d.batch_stride_b);
    p->lt_b = d.trans_a ? make_layout(in_b, d.m, d.k, d.m, d.batch, d.batch_stride_a)
                        : make_layout(in_b, d.k, d.m, d.k, d.batch, d.batch_stride_a);
    p->lt_out = make_layout(out, d.n, d.m, d.n, d.batch, d.batch_stride_out);

    cublasLtMatmulPreference_t pref = nullptr;
    FSDP_CALL(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws_bytes = kWorkspaceBytes;
    const uint32_t al_a = uint32_t(key.align_b), al_b = uint32_t(key.align_a),
                   al_c = uint32_t(key.align_out);
    const int requested = tuning.enabled ? std::max(1, tuning.candidates) : 1;
    std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(requested));
    int found = 0;
    cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                    &al_a, sizeof(al_a));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                    &al_b, sizeof(al_b));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                    &al_c, sizeof(al_c));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                    &al_c, sizeof(al_c));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulAlgoGetHeuristic(handle, p->op, p->lt_a, p->lt_b, p->lt_out,
                                              p->lt_out, pref, requested, results.data(),
                                              &found);
    cublasLtMatmulPreferenceDestroy(pref);
    // No BiasGrad algorithm for this problem is an answer, not an error (try_matmul); nor is
    // a missing FP8 one (an epilogue or output type its FP8 kernels lack: try_fp8_matmul).
    if ((key.fp8 || key.epilogue == MatmulEpilogue::BiasGrad) &&
        (found == 0 || status != CUBLAS_STATUS_SUCCESS))
      return nullptr;
    FSDP_CHECK(status == CUBLAS_STATUS_SUCCESS && found > 0, ValueError,
               "matmul (cuBLASLt): no algorithm for (", d.m, " x ", d.k, ") @ (", d.k, " x ", d.n,
               ") batch ", d.batch, ", ", dtype_name(key.in), " -> ", dtype_name(key.out),
               key.epilogue == MatmulEpilogue::Gelu    ? ", GELU"
               : key.epilogue == MatmulEpilogue::DGelu ? ", DGELU"
                                                       : "",
               key.bias ? ", bias" : "", ": ",
               cublasLtGetStatusString(status));
    for (int i = 0; i < found; ++i) p->candidates.push_back(results[size_t(i)].algo);
    p->algo = p->candidates.front();
    p->tuned = p->candidates.size() < 2 || (key.fp8 != 0 && !tuning.fp8);
    return p;
  }

  // Whether this call of `p` is the one to time its candidates on (MatmulTuning).
  bool should_tune(Plan& p, CUstream_st* stream) {
    ++p.uses;
    if (!tuning.enabled || p.tuned || p.uses < tuning.after_uses ||
        tuned.size() >= tuning.max_tuned)
      return false;
    // Inside a capture nothing runs, so nothing can be timed.
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    FSDP_CALL(cudaStreamIsCapturing(stream, &capturing));
    return capturing == cudaStreamCaptureStatusNone;
  }

  // Times each candidate of `p` on the call's own operands and keeps the fastest. With beta
  // = 0 every run rewrites the output (and the epilogue's aux or bias sums), so the real
  // call that follows leaves exactly what an untuned call would. With beta != 0 (weight
  // gradients accumulating) the runs are timed as they are, then the output is put back
  // from a host copy: a device copy would add the output's size to the peak memory.
  void tune(Plan& p, const PlanKey& key, const Operands& o) {
    p.tuned = true;
    const MatmulDims& d = key.d;
    const size_t out_bytes =
        size_t((d.batch - 1) * d.batch_stride_out + d.m * d.n) * dtype_size(key.out);
    std::vector<unsigned char> saved;
    if (o.accumulates) {
      saved.resize(out_bytes);
      FSDP_CALL(cudaMemcpyAsync(saved.data(), o.out, out_bytes, cudaMemcpyDeviceToHost, o.stream));
      FSDP_CALL(cudaStreamSynchronize(o.stream));
    }
    const Stream stream = Stream::wrap_cuda(ctx.device().index, o.stream);
    Event start = Event::create(ctx.device(), true), stop = Event::create(ctx.device(), true);
    const int runs = std::max(1, tuning.timed_runs);
    auto run = [&](const cublasLtMatmulAlgo_t& algo) {
      return cublasLtMatmul(handle, p.op, o.alpha, o.b, p.lt_a, o.a, p.lt_b, o.beta, o.out,
                            p.lt_out, o.out, p.lt_out, &algo, o.workspace, kWorkspaceBytes,
                            o.stream);
    };
    MatmulTuningRecord record{key.d, key.in, key.out, key.epilogue, key.bias, key.fp8 != 0, 0, 0, -1.0, -1.0};
    for (size_t i = 0; i < p.candidates.size(); ++i) {
      // A candidate cuBLASLt declines at run time is skipped, not an error.
      if (run(p.candidates[i]) != CUBLAS_STATUS_SUCCESS) continue;
      start.record(stream);
      for (int r = 0; r < runs; ++r) FSDP_CALL(run(p.candidates[i]));
      stop.record(stream);
      stop.synchronize();
      const double per_run = double(Event::elapsed_ms(start, stop)) / runs;
      if (i == 0) record.heuristic_ms = per_run;
      ++record.candidates;
      if (record.best_ms < 0 || per_run < record.best_ms) {
        record.best_ms = per_run;
        record.chosen = int(i);
      }
    }
    if (!saved.empty()) {
      FSDP_CALL(cudaMemcpyAsync(o.out, saved.data(), out_bytes, cudaMemcpyHostToDevice, o.stream));
      FSDP_CALL(cudaStreamSynchronize(o.stream));  // before `saved` goes
    }
    if (record.candidates == 0) return;  // none ran: the real call reports why
    p.algo = p.candidates[size_t(record.chosen)];
    tuned.push_back(record);
  }

  static void set_pointers(Plan& p, const void* bias, void* aux, bool aux_is_bias_grad) {
    if (aux_is_bias_grad) {  // BGRADB writes the bias gradient through the bias pointer
      FSDP_CALL(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &aux,
                                               sizeof(aux)));
      return;
    }
    if (bias)
      FSDP_CALL(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                               sizeof(bias)));
    if (aux)
      FSDP_CALL(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                               &aux, sizeof(aux)));
  }
};

Blas::Blas(Context& ctx) : impl_(std::make_unique<Impl>(ctx)) {}
Blas::~Blas() = default;

size_t Blas::cached_plans() const { return impl_->plans.size(); }

void Blas::set_tuning(const MatmulTuning& tuning) {
  impl_->tuning = tuning;
  // Plans made before asked the heuristic for one candidate only; dropping them is safe (see
  // find_or_make).
  impl_->plans.clear();
}

const MatmulTuning& Blas::tuning() const { return impl_->tuning; }

const std::vector<MatmulTuningRecord>& Blas::tuning_records() const { return impl_->tuned; }

void Blas::matmul(const MatmulDims& d, void* out, DType out_dtype, const void* a, const void* b,
                  DType in_dtype, double alpha, double beta, const void* bias, void* aux,
                  MatmulEpilogue epilogue) {
  FSDP_CHECK(epilogue != MatmulEpilogue::BiasGrad, ValueError,
             "matmul: the BiasGrad epilogue goes through Blas::try_matmul");
  try_matmul(d, out, out_dtype, a, b, in_dtype, alpha, beta, bias, aux, epilogue);
}

bool Blas::try_matmul(const MatmulDims& d, void* out, DType out_dtype, const void* a,
                      const void* b, DType in_dtype, double alpha, double beta, const void* bias,
                      void* aux, MatmulEpilogue epilogue) {
  if (d.m == 0 || d.n == 0 || d.batch == 0) return epilogue != MatmulEpilogue::BiasGrad;
  const bool bias_grad = epilogue == MatmulEpilogue::BiasGrad;
  if (bias_grad && (d.k == 0 || d.batch != 1 || !aux)) return false;
  FSDP_CHECK(in_dtype == DType::bf16 || in_dtype == DType::f32, DTypeError,
             "matmul: CUDA inputs must be bf16 or f32, got ", dtype_name(in_dtype));
  CUstream_st* stream = impl_->ctx.stream().cuda_stream();
  const bool gelu = epilogue == MatmulEpilogue::Gelu;
  if (aux && !bias_grad && d.n % 8 != 0) {
    // cuBLASLt reads or writes the GELU input only with a leading dimension divisible by 8:
    // run the plain product (with bias) and then our GELU kernels.
    if (gelu) {
      matmul(d, aux, out_dtype, a, b, in_dtype, alpha, beta, bias, nullptr, MatmulEpilogue::None);
      gelu_forward(out, aux, d.m * d.n, out_dtype, stream);
    } else {
      matmul(d, out, out_dtype, a, b, in_dtype, alpha, beta, bias, nullptr, MatmulEpilogue::None);
      gelu_backward(out, out, aux, d.m * d.n, out_dtype, stream);  // elementwise, in place
    }
    return true;
  }
  if (d.k == 0) {
    // cuBLASLt rejects K = 0; the product is empty, so out = beta * out (+ bias, GELU).
    FSDP_CHECK(beta == 0.0 && !bias && epilogue == MatmulEpilogue::None, ValueError,
               "matmul: K = 0 with beta, bias or GELU is not supported on CUDA");
    FSDP_CALL(cudaMemsetAsync(out, 0, size_t(d.batch * d.m * d.n) * dtype_size(out_dtype), stream));
    return true;
  }
  PlanKey key{d,
              in_dtype,
              out_dtype,
              bias != nullptr,
              epilogue,
              aux != nullptr,
              alignment(a),
              alignment(b),
              alignment(out),
              alignment(bias),
              alignment(aux)};
  void* ws = impl_->workspace(stream);
  Plan* plan = impl_->find_or_make(key, bias, aux);
  if (!plan) return false;  // cuBLASLt has no BiasGrad algorithm for this problem
  Plan& p = *plan;
  Impl::set_pointers(p, bias, aux, bias_grad);
  const float alpha_f = float(alpha), beta_f = float(beta);
  if (impl_->should_tune(p, stream))
    impl_->tune(p, key, Operands{&alpha_f, &beta_f, a, b, out, ws, stream, beta_f != 0.0f});
  FSDP_CALL(cublasLtMatmul(impl_->handle, p.op, &alpha_f, b, p.lt_a, a, p.lt_b, &beta_f, out,
                           p.lt_out, out, p.lt_out, &p.algo, ws, kWorkspaceBytes, stream));
  return true;
}

bool Blas::try_fp8_matmul(int64_t m, int64_t n, int64_t k, void* out, DType out_dtype,
                          const void* a, Fp8Format format_a, const float* scale_inv_a,
                          const void* b, Fp8Format format_b, const float* scale_inv_b,
                          double alpha, double beta, const void* bias, void* aux,
                          MatmulEpilogue epilogue, bool fast_accum) {
  FSDP_CHECK(out_dtype == DType::bf16 || out_dtype == DType::f32, DTypeError,
             "fp8 matmul: the output must be bf16 or f32, got ", dtype_name(out_dtype));
  FSDP_CHECK(!(format_a == Fp8Format::e5m2 && format_b == Fp8Format::e5m2), DTypeError,
             "fp8 matmul: e5m2 x e5m2 has no tensor-core kernel (one operand must be e4m3)");
  FSDP_CHECK(epilogue == MatmulEpilogue::None || epilogue == MatmulEpilogue::Gelu ||
                 epilogue == MatmulEpilogue::DGelu,
             ValueError, "fp8 matmul: unsupported epilogue");
  if (m == 0 || n == 0) return true;
  if (!fp8_shape_ok(m, n, k)) return false;  // K-major operands, sizes multiples of 16
  MatmulDims d;
  d.m = m;
  d.n = n;
  d.k = k;
  d.trans_b = true;
  CUstream_st* stream = impl_->ctx.stream().cuda_stream();
  PlanKey key{d,
              out_dtype,
              out_dtype,
              bias != nullptr,
              epilogue,
              aux != nullptr,
              alignment(a),
              alignment(b),
              alignment(out),
              alignment(bias),
              alignment(aux),
              1 + 2 * int(format_a) + int(format_b),
              fast_accum};
  void* ws = impl_->workspace(stream);
  Plan* plan = impl_->find_or_make(key, bias, aux);
  if (!plan) return false;
  Plan& p = *plan;
  Impl::set_pointers(p, bias, aux, false);
  const Tensor scalars = impl_->ctx.empty(Shape{2}, DType::f32);  // alpha, beta on the device
  float* alpha_beta = static_cast<float*>(scalars.data_ptr());
  fp8_matmul_scalars(alpha_beta, scale_inv_a, scale_inv_b, float(alpha), float(beta), stream);
  // Timed as the other plans are (MatmulTuning), with the device's alpha and beta.
  if (impl_->should_tune(p, stream))
    impl_->tune(p, key, Operands{alpha_beta, alpha_beta + 1, a, b, out, ws, stream, beta != 0.0});
  FSDP_CALL(cublasLtMatmul(impl_->handle, p.op, alpha_beta, b, p.lt_a, a, p.lt_b, alpha_beta + 1,
                           out, p.lt_out, out, p.lt_out, &p.algo, ws, kWorkspaceBytes, stream));
  return true;
}

namespace {

int32_t scale_mode(Fp8Granularity g) {
  switch (g) {
    case Fp8Granularity::block_1x128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case Fp8Granularity::block_128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    // One f32 per row of each K-major operand: cuBLASLt's vectors of M and of N.
    case Fp8Granularity::row: return CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    default: FSDP_THROW(ValueError, "fp8 block matmul: operands must be block- or row-scaled");
  }
}

}  // namespace

bool Blas::try_fp8_block_matmul(int64_t m, int64_t n, int64_t k, void* out, DType out_dtype,
                                const void* a, Fp8Format format_a, Fp8Granularity granularity_a,
                                const float* scale_a, const void* b, Fp8Format format_b,
                                Fp8Granularity granularity_b, const float* scale_b,
                                double alpha, double beta, const void* bias) {
  FSDP_CHECK(out_dtype == DType::bf16 || out_dtype == DType::f32, DTypeError,
             "fp8 block matmul: the output must be bf16 or f32, got ", dtype_name(out_dtype));
  FSDP_CHECK(!(format_a == Fp8Format::e5m2 && format_b == Fp8Format::e5m2), DTypeError,
             "fp8 block matmul: e5m2 x e5m2 has no tensor-core kernel (one operand must be e4m3)");
  const int32_t mode_a = scale_mode(granularity_a), mode_b = scale_mode(granularity_b);
  FSDP_CHECK(!(granularity_a == Fp8Granularity::block_128x128 &&
               granularity_b == Fp8Granularity::block_128x128),
             ValueError, "fp8 block matmul: 128x128 x 128x128 is not offered (one operand 1x128)");
  const bool rows = granularity_a == Fp8Granularity::row;
  FSDP_CHECK(rows == (granularity_b == Fp8Granularity::row), ValueError,
             "fp8 block matmul: a row-scaled operand needs a row-scaled partner");
  if (m == 0 || n == 0) return true;
  if (!fp8_shape_ok(m, n, k) || (!rows && k % kFp8Block != 0)) return false;
  MatmulDims d;
  d.m = m;
  d.n = n;
  d.k = k;
  d.trans_b = true;
  CUstream_st* stream = impl_->ctx.stream().cuda_stream();
  PlanKey key{d,
              out_dtype,
              out_dtype,
              bias != nullptr,
              MatmulEpilogue::None,
              false,
              alignment(a),
              alignment(b),
              alignment(out),
              alignment(bias),
              alignment(nullptr),
              1 + 2 * int(format_a) + int(format_b),
              false,
              mode_a,
              mode_b};
  void* ws = impl_->workspace(stream);
  Plan* plan = impl_->find_or_make(key, bias, nullptr, scale_a, scale_b);
  if (!plan) return false;
  Plan& p = *plan;
  Impl::set_pointers(p, bias, nullptr, false);
  // cuBLASLt's A is our b, its B our a: each takes its own operand's scales (this call's).
  FSDP_CALL(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_b,
                                           sizeof(scale_b)));
  FSDP_CALL(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_a,
                                           sizeof(scale_a)));
  const float alpha_f = float(alpha), beta_f = float(beta);
  ++p.uses;
  FSDP_CALL(cublasLtMatmul(impl_->handle, p.op, &alpha_f, b, p.lt_a, a, p.lt_b, &beta_f, out,
                           p.lt_out, out, p.lt_out, &p.algo, ws, kWorkspaceBytes, stream));
  return true;
}

bool matmul_bias_grad(Blas& blas, const MatmulDims& dims, void* dw, DType dw_dtype, const void* a,
                      const void* b, DType in_dtype, double alpha, double beta, void* dbias,
                      DType dbias_dtype, bool accumulate, const Scratch& scratch,
                      stream_t stream) {
  const bool direct = dbias_dtype == DType::f32 && !accumulate;
  void* sums = direct ? dbias : scratch(size_t(dims.m) * sizeof(float));
  if (!blas.try_matmul(dims, dw, dw_dtype, a, b, in_dtype, alpha, beta, nullptr, sums,
                       MatmulEpilogue::BiasGrad))
    return false;
  if (!direct)
    axpby(dbias, dbias_dtype, sums, DType::f32, 1.0, accumulate ? 1.0 : 0.0, dims.m, stream);
  return true;
}

}  // namespace fsdp::kernels::cuda
