#include "kernels/cuda/grouped_matmul.h"

#include <cublas_v2.h>

#include <algorithm>

#include "kernels/cuda/library_check.h"

namespace fsdp::kernels::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: FSDP_THROW(DTypeError, "grouped matmul (cuBLAS): unsupported dtype ", dtype_name(t));
  }
}

// One expert's column-major problem C (m, n) = alpha op(A) op(B) + beta C.
struct Problem {
  int m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
};

// Pinned host slots for the pointer arrays: cuBLAS reads them from device memory, and an
// upload from pageable memory could wait for the stream.
constexpr int kSlots = 4;

}  // namespace

struct GroupedBlas::Impl {
  Context& ctx;
  cublasHandle_t handle = nullptr;
  std::vector<Tensor> staging;  // (kSlots) pinned pointer arrays
  std::vector<Event> uploaded;  // after each slot's upload
  int next = 0;

  explicit Impl(Context& c) : ctx(c), staging(kSlots), uploaded(kSlots) {
    DeviceGuard guard(ctx.device());
    FSDP_CALL(cublasCreate(&handle));
    FSDP_CALL(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));
  }
  ~Impl() {
    if (handle) cublasDestroy(handle);  // destruction cannot report errors
  }

  // The problems as one grouped call (a group of one per expert); false when cuBLAS does
  // not support the dtypes.
  bool run(cublasOperation_t ta, cublasOperation_t tb, const std::vector<Problem>& problems,
           DType in, DType out, double beta) {
    const int groups = int(problems.size());
    if (groups == 0) return true;
    const int64_t count = 3 * int64_t(groups);
    // The device arrays A, B, C, through a pinned slot whose previous upload has finished.
    Tensor& slot = staging[size_t(next)];
    uploaded[size_t(next)].synchronize();
    if (!slot.defined() || slot.numel() < count) slot = ctx.empty_pinned(Shape{count}, DType::i64);
    const void** host = static_cast<const void**>(slot.data_ptr());
    for (int g = 0; g < groups; ++g) {
      host[g] = problems[size_t(g)].a;
      host[groups + g] = problems[size_t(g)].b;
      host[2 * groups + g] = problems[size_t(g)].c;
    }
    const Tensor arrays = ctx.empty(Shape{count}, DType::i64);
    const cudaStream_t stream = ctx.stream().cuda_stream();
    FSDP_CALL(cudaMemcpyAsync(arrays.data_ptr(), host, size_t(count) * sizeof(void*),
                              cudaMemcpyHostToDevice, stream));
    uploaded[size_t(next)].record(ctx.stream());
    next = (next + 1) % kSlots;

    const std::vector<cublasOperation_t> tas(static_cast<size_t>(groups), ta);
    const std::vector<cublasOperation_t> tbs(static_cast<size_t>(groups), tb);
    std::vector<int> m, n, k, lda, ldb, ldc, sizes(static_cast<size_t>(groups), 1);
    for (const Problem& p : problems) {
      m.push_back(p.m);
      n.push_back(p.n);
      k.push_back(p.k);
      lda.push_back(p.lda);
      ldb.push_back(p.ldb);
      ldc.push_back(p.ldc);
    }
    const std::vector<float> alphas(static_cast<size_t>(groups), 1.0f);
    const std::vector<float> betas(static_cast<size_t>(groups), static_cast<float>(beta));
    const void* const* d = static_cast<const void* const*>(arrays.data_ptr());
    FSDP_CALL(cublasSetStream(handle, stream));
    const cublasStatus_t status = cublasGemmGroupedBatchedEx(
        handle, tas.data(), tbs.data(), m.data(), n.data(), k.data(), alphas.data(), d,
        cuda_type(in), lda.data(), d + groups, cuda_type(in), ldb.data(), betas.data(),
        const_cast<void* const*>(d + 2 * groups), cuda_type(out), ldc.data(), groups,
        sizes.data(), CUBLAS_COMPUTE_32F);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
    FSDP_CALL(status);
    return true;
  }
};

GroupedBlas::GroupedBlas(Context& ctx) : impl_(std::make_unique<Impl>(ctx)) {}
GroupedBlas::~GroupedBlas() = default;

namespace {

const char* at(const void* p, int64_t elements, DType dtype) {
  return static_cast<const char*>(p) + elements * int64_t(dtype_size(dtype));
}
char* at(void* p, int64_t elements, DType dtype) {
  return static_cast<char*>(p) + elements * int64_t(dtype_size(dtype));
}

}  // namespace

namespace {

// One problem per expert with rows that the grouped call takes; make(e, begin, rows) builds
// expert e's, whose rows start at `begin`.
template <typename Make>
std::vector<Problem> expert_problems(const GroupedMatmulDims& d, Make make) {
  std::vector<Problem> problems;
  int64_t begin = 0;
  for (size_t e = 0; e < d.rows.size(); ++e) {
    const int64_t r = d.rows[e];
    if (r > 0 && r <= d.max_rows) problems.push_back(make(int64_t(e), begin, int(r)));
    begin += r;
  }
  return problems;
}

}  // namespace

bool GroupedBlas::forward(const GroupedMatmulDims& d, void* y, const void* x, const void* w) {
  // Column-major y_e^T (F, r) = w_e (K, F)^T x_e^T (K, r).
  const int F = int(d.F), K = int(d.K);
  const auto problems = expert_problems(d, [&](int64_t e, int64_t begin, int r) {
    return Problem{F, r, K, K, K, F, at(w, e * d.F * d.K, d.dtype), at(x, begin * d.K, d.dtype),
                   at(y, begin * d.F, d.dtype)};
  });
  return impl_->run(CUBLAS_OP_T, CUBLAS_OP_N, problems, d.dtype, d.dtype, 0.0);
}

bool GroupedBlas::input_grad(const GroupedMatmulDims& d, void* dx, const void* dy, const void* w) {
  // Column-major dx_e^T (K, r) = w_e^T (K, F) dy_e^T (F, r).
  const int F = int(d.F), K = int(d.K);
  const auto problems = expert_problems(d, [&](int64_t e, int64_t begin, int r) {
    return Problem{K, r, F, K, F, K, at(w, e * d.F * d.K, d.dtype), at(dy, begin * d.F, d.dtype),
                   at(dx, begin * d.K, d.dtype)};
  });
  return impl_->run(CUBLAS_OP_N, CUBLAS_OP_N, problems, d.dtype, d.dtype, 0.0);
}

bool GroupedBlas::weight_grad(const GroupedMatmulDims& d, void* dw, DType dw_dtype,
                              const void* dy, const void* x, double beta) {
  // Column-major dw_e^T (K, F) = x_e^T (K, r) dy_e (r, F) + beta dw_e^T.
  const int F = int(d.F), K = int(d.K);
  const auto problems = expert_problems(d, [&](int64_t e, int64_t begin, int r) {
    return Problem{K, F, r, K, F, K, at(x, begin * d.K, d.dtype), at(dy, begin * d.F, d.dtype),
                   at(dw, e * d.F * d.K, dw_dtype)};
  });
  return impl_->run(CUBLAS_OP_N, CUBLAS_OP_T, problems, d.dtype, dw_dtype, beta);
}

}  // namespace fsdp::kernels::cuda
