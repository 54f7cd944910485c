// Dispatch of the mixture-of-experts ops (kernels/moe.h): routing, the grouping of rows
// by expert and the gathers to and from it on kernels/cpu/moe.h and kernels/cuda/moe.h; the
// grouped matmul as one ops::matmul per expert on views of the contiguous buffers.
#include "kernels/moe.h"

#include <limits>

#include "kernels/basic.h"
#include "kernels/checks.h"
#include "kernels/cpu/moe.h"
#include "kernels/matmul.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/grouped_matmul.h"
#include "kernels/cuda/moe.h"
#endif

namespace fsdp::ops {
namespace {

using namespace detail;

// A contiguous 2-D tensor on ctx.
void check_matrix(Context& ctx, const Tensor& t, const char* what, const char* name) {
  check_on_ctx(ctx, t, what);
  check_contiguous(t, what);
  FSDP_CHECK(t.dim() == 2, ShapeError, what, ": ", name, " must be 2-D, got ", t.str());
}

// The row maps index with int32: every count of rows must fit.
void check_int32_rows(int64_t rows, const char* what) {
  FSDP_CHECK(rows <= std::numeric_limits<int32_t>::max(), ShapeError, what, ": ", rows,
             " rows exceed the int32 row maps");
}

kernels::RouterDims router_dims(Context& ctx, const Tensor& logits_like,
                                const RouterOptions& options, const char* what) {
  check_matrix(ctx, logits_like, what, "the logits");
  check_floating(logits_like, what);
  kernels::RouterDims d;
  d.tokens = logits_like.size(0);
  d.experts = logits_like.size(1);
  d.top_k = options.top_k;
  d.score = options.score;
  d.normalize = options.normalize;
  d.dtype = logits_like.dtype();
  FSDP_CHECK(d.experts >= 1, ShapeError, what, ": the logits ", logits_like.str(),
             " have no experts");
  FSDP_CHECK(d.top_k >= 1 && d.top_k <= d.experts, ValueError, what, ": top_k must lie in [1, ",
             d.experts, "] for ", d.experts, " experts, got ", d.top_k);
  check_int32_rows(d.tokens * d.experts, what);
#if FSDP_WITH_CUDA
  FSDP_CHECK(ctx.device().is_cpu() || d.experts <= kernels::cuda::kMaxRouterExperts, ValueError,
             what, ": the CUDA router takes at most ", kernels::cuda::kMaxRouterExperts,
             " experts, got ", d.experts);
#endif
  return d;
}

// Rows x (N, C) and the pair maps: checks dest (N, k) i32 and returns the dims.
kernels::MoeRowsDims rows_dims(Context& ctx, const Tensor& tokens, const Tensor& dest,
                               const char* what) {
  check_matrix(ctx, tokens, what, "the token rows");
  check_floating(tokens, what);
  check_matrix(ctx, dest, what, "dest");
  check_dtype(dest, DType::i32, what);
  FSDP_CHECK(dest.size(0) == tokens.size(0), ShapeError, what, ": dest ", dest.str(),
             " must have a row per token of ", tokens.str());
  kernels::MoeRowsDims d;
  d.tokens = tokens.size(0);
  d.channels = tokens.size(1);
  d.top_k = dest.size(1);
  d.dtype = tokens.dtype();
  check_int32_rows(d.rows(), what);
  return d;
}

// The sorted rows (R, C) of d, in d's dtype.
void check_sorted_rows(Context& ctx, const Tensor& t, const kernels::MoeRowsDims& d,
                       const char* what) {
  check_dense(ctx, t, Shape{d.rows(), d.channels}, d.dtype, what);
}

// Experts' rows: counts (E entries, >= 0) summing to rows.
void check_counts(const std::vector<int64_t>& counts, int64_t experts, int64_t rows,
                  const char* what) {
  FSDP_CHECK(int64_t(counts.size()) == experts, ShapeError, what, ": ", counts.size(),
             " counts for ", experts, " experts");
  int64_t total = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    FSDP_CHECK(counts[e] >= 0, ValueError, what, ": negative count ", counts[e], " of expert ", e);
    total += counts[e];
  }
  FSDP_CHECK(total == rows, ShapeError, what, ": the counts add up to ", total, " rows, x has ",
             rows);
}

// x (R, K) and w (E, F, K): returns F.
int64_t check_grouped(Context& ctx, const Tensor& x, const Tensor& w,
                      const std::vector<int64_t>& counts, const char* what) {
  check_matrix(ctx, x, what, "x");
  check_on_ctx(ctx, w, what);
  check_contiguous(w, what);
  FSDP_CHECK(w.dim() == 3 && w.size(2) == x.size(1), ShapeError, what,
             ": the expert weights must be (E, F, K = ", x.size(1), "), got ", w.str());
  check_counts(counts, w.size(0), x.size(0), what);
  return w.size(1);
}

}  // namespace

void moe_router_forward(Context& ctx, const Tensor& indices, const Tensor& weights,
                        const Tensor& scores, const Tensor& logits, const RouterOptions& options,
                        const Tensor& expert_bias) {
  const char* what = "moe_router_forward";
  const kernels::RouterDims d = router_dims(ctx, logits, options, what);
  const DType stats = stats_dtype(d.dtype);
  check_dense(ctx, indices, Shape{d.tokens, d.top_k}, DType::i32, what);
  check_dense(ctx, weights, Shape{d.tokens, d.top_k}, stats, what);
  check_dense(ctx, scores, Shape{d.tokens, d.experts}, stats, what);
  if (expert_bias.defined()) check_dense(ctx, expert_bias, Shape{d.experts}, DType::f32, what);
  const float* bias = expert_bias.defined() ? expert_bias.data<float>() : nullptr;
  if (ctx.device().is_cpu()) {
    kernels::cpu::moe_router_forward(d, indices.data<int32_t>(), weights.data_ptr(),
                                     scores.data_ptr(), logits.data_ptr(), bias);
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::moe_router_forward(d, indices.data<int32_t>(), weights.data<float>(),
                                    scores.data<float>(), logits.data_ptr(), bias,
                                    ctx.stream().cuda_stream());
#endif
}

void moe_router_backward(Context& ctx, const Tensor& dlogits, const Tensor& dweights,
                         const Tensor& scores, const Tensor& indices, const RouterOptions& options,
                         const Tensor& dscores) {
  const char* what = "moe_router_backward";
  const kernels::RouterDims d = router_dims(ctx, dlogits, options, what);
  const DType stats = stats_dtype(d.dtype);
  check_dense(ctx, dweights, Shape{d.tokens, d.top_k}, stats, what);
  check_dense(ctx, scores, Shape{d.tokens, d.experts}, stats, what);
  check_dense(ctx, indices, Shape{d.tokens, d.top_k}, DType::i32, what);
  if (dscores.defined()) check_dense(ctx, dscores, Shape{d.tokens, d.experts}, stats, what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::moe_router_backward(d, dlogits.data_ptr(), dweights.data_ptr(),
                                      data_or_null(dscores), scores.data_ptr(),
                                      indices.data<int32_t>());
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::moe_router_backward(
      d, dlogits.data_ptr(), dweights.data<float>(),
      dscores.defined() ? dscores.data<float>() : nullptr, scores.data<float>(),
      indices.data<int32_t>(), ctx.stream().cuda_stream());
#endif
}

void moe_group_expert_counts(Context& ctx, const Tensor& counts, const Tensor& indices,
                             int64_t groups) {
  const char* what = "moe_group_expert_counts";
  check_matrix(ctx, indices, what, "the expert indices");
  check_matrix(ctx, counts, what, "the counts");
  kernels::MoeLossDims d;
  d.tokens = indices.size(0);
  d.top_k = indices.size(1);
  d.experts = counts.size(1);
  d.groups = groups;
  FSDP_CHECK(groups >= 1 && d.tokens % groups == 0, ShapeError, what, ": ", d.tokens,
             " tokens are not ", groups, " equal runs");
  check_dense(ctx, indices, Shape{d.tokens, d.top_k}, DType::i32, what);
  check_dense(ctx, counts, Shape{groups, d.experts}, DType::i32, what);
  check_int32_rows(d.tokens * d.top_k, what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::moe_group_expert_counts(d, counts.data<int32_t>(), indices.data<int32_t>());
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::moe_group_expert_counts(d, counts.data<int32_t>(), indices.data<int32_t>(),
                                         ctx.stream().cuda_stream());
#endif
}

void moe_balancing_loss(Context& ctx, const Tensor& per_token, const Tensor& dscores,
                        const Tensor& scores, const Tensor& indices, int64_t groups,
                        bool sigmoid, double coeff, const Tensor& run_counts,
                        int64_t run_tokens) {
  const char* what = "moe_balancing_loss";
  check_matrix(ctx, scores, what, "the scores");
  check_matrix(ctx, indices, what, "the expert indices");
  kernels::MoeLossDims d;
  d.tokens = scores.size(0);
  d.experts = scores.size(1);
  d.top_k = indices.size(1);
  d.groups = groups;
  d.sigmoid = sigmoid;
  d.dtype = scores.dtype() == DType::f64 ? DType::f64 : DType::f32;
  FSDP_CHECK(groups >= 1 && d.tokens % groups == 0, ShapeError, what, ": ", d.tokens,
             " tokens are not ", groups, " equal runs");
  const DType stats = stats_dtype(d.dtype);
  check_dense(ctx, scores, Shape{d.tokens, d.experts}, stats, what);
  check_dense(ctx, indices, Shape{d.tokens, d.top_k}, DType::i32, what);
  check_dense(ctx, per_token, Shape{d.tokens}, stats, what);
  check_dense(ctx, dscores, Shape{d.tokens, d.experts}, stats, what);
  check_int32_rows(d.tokens * d.top_k, what);
  const bool counted = run_counts.defined();
  if (counted) {
    check_dense(ctx, run_counts, Shape{groups, d.experts}, DType::i32, what);
    FSDP_CHECK(run_tokens >= d.tokens / groups, ShapeError, what, ": whole runs of ", run_tokens,
               " tokens cannot hold these runs of ", d.tokens / groups);
    d.run_tokens = run_tokens;
  }
  if (ctx.device().is_cpu()) {
    kernels::cpu::moe_balancing_loss(d, per_token.data_ptr(), dscores.data_ptr(),
                                     scores.data_ptr(), indices.data<int32_t>(), coeff,
                                     counted ? run_counts.data<int32_t>() : nullptr);
    return;
  }
#if FSDP_WITH_CUDA
  // The runs' choices as given, or counted here into a workspace.
  const Tensor counts = counted ? run_counts : ctx.empty(Shape{groups, d.experts}, DType::i32);
  kernels::cuda::moe_balancing_loss(d, per_token.data<float>(), dscores.data<float>(),
                                    scores.data<float>(), indices.data<int32_t>(),
                                    counts.data<int32_t>(), counted, coeff,
                                    ctx.stream().cuda_stream());
#endif
}

void moe_z_loss(Context& ctx, const Tensor& per_token, const Tensor& dlogits,
                const Tensor& logits, double coeff) {
  const char* what = "moe_z_loss";
  check_matrix(ctx, logits, what, "the logits");
  kernels::MoeLossDims d;
  d.tokens = logits.size(0);
  d.experts = logits.size(1);
  d.dtype = logits.dtype();
  check_dense(ctx, logits, Shape{d.tokens, d.experts}, d.dtype, what);
  check_dense(ctx, dlogits, Shape{d.tokens, d.experts}, d.dtype, what);
  check_dense(ctx, per_token, Shape{d.tokens}, stats_dtype(d.dtype), what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::moe_z_loss(d, per_token.data_ptr(), dlogits.data_ptr(), logits.data_ptr(), coeff);
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::moe_z_loss(d, per_token.data<float>(), dlogits.data_ptr(), logits.data_ptr(),
                            coeff, ctx.stream().cuda_stream());
#endif
}

void moe_sort_by_expert(Context& ctx, const Tensor& counts, const Tensor& source,
                        const Tensor& dest, const Tensor& indices) {
  const char* what = "moe_sort_by_expert";
  check_matrix(ctx, indices, what, "the expert indices");
  check_dtype(indices, DType::i32, what);
  const int64_t N = indices.size(0), k = indices.size(1);
  check_int32_rows(N * k, what);
  check_on_ctx(ctx, counts, what);
  FSDP_CHECK(counts.dim() == 1 && counts.size(0) >= 1, ShapeError, what,
             ": counts must be (E) with E >= 1, got ", counts.str());
  const int64_t E = counts.size(0);
  check_dense(ctx, counts, Shape{E}, DType::i32, what);
  check_dense(ctx, source, Shape{N * k}, DType::i32, what);
  check_dense(ctx, dest, Shape{N, k}, DType::i32, what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::moe_sort_by_expert(N, k, E, counts.data<int32_t>(), source.data<int32_t>(),
                                     dest.data<int32_t>(), indices.data<int32_t>());
    return;
  }
#if FSDP_WITH_CUDA
  Tensor workspace =
      ctx.empty(Shape{int64_t(kernels::cuda::moe_sort_workspace_bytes(N, k, E))}, DType::u8);
  kernels::cuda::moe_sort_by_expert(N, k, E, counts.data<int32_t>(), source.data<int32_t>(),
                                    dest.data<int32_t>(), indices.data<int32_t>(),
                                    workspace.data_ptr(), ctx.stream().cuda_stream());
#endif
}

void moe_permute(Context& ctx, const Tensor& x_sorted, const Tensor& x, const Tensor& source) {
  const char* what = "moe_permute";
  check_matrix(ctx, x, what, "x");
  check_floating(x, what);
  check_on_ctx(ctx, source, what);
  check_dtype(source, DType::i32, what);
  check_contiguous(source, what);
  FSDP_CHECK(source.dim() == 1, ShapeError, what, ": source must be (R), got ", source.str());
  kernels::MoeRowsDims d;
  d.tokens = x.size(0);
  d.channels = x.size(1);
  d.dtype = x.dtype();
  const int64_t R = source.size(0);
  // R = N k: the kernels see the rows as k per token.
  FSDP_CHECK(d.tokens > 0 ? R % d.tokens == 0 : R == 0, ShapeError, what, ": ", R,
             " sorted rows are not a whole number per token of x ", x.str());
  d.top_k = d.tokens > 0 ? R / d.tokens : 0;
  check_int32_rows(R, what);
  check_sorted_rows(ctx, x_sorted, d, what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::moe_permute(d, x_sorted.data_ptr(), x.data_ptr(), source.data<int32_t>());
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::moe_permute(d, x_sorted.data_ptr(), x.data_ptr(), source.data<int32_t>(),
                             ctx.stream().cuda_stream());
#endif
}

void moe_permute_backward(Context& ctx, const Tensor& dx, const Tensor& dx_sorted,
                          const Tensor& dest, bool accumulate_dx) {
  const char* what = "moe_permute_backward";
  const kernels::MoeRowsDims d = rows_dims(ctx, dx, dest, what);
  check_sorted_rows(ctx, dx_sorted, d, what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::moe_permute_backward(d, dx.data_ptr(), dx_sorted.data_ptr(),
                                       dest.data<int32_t>(), accumulate_dx);
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::moe_permute_backward(d, dx.data_ptr(), dx_sorted.data_ptr(),
                                      dest.data<int32_t>(), accumulate_dx,
                                      ctx.stream().cuda_stream());
#endif
}

void moe_unpermute(Context& ctx, const Tensor& out, const Tensor& y_sorted,
                   const Tensor& weights, const Tensor& dest) {
  const char* what = "moe_unpermute";
  const kernels::MoeRowsDims d = rows_dims(ctx, out, dest, what);
  check_sorted_rows(ctx, y_sorted, d, what);
  check_dense(ctx, weights, Shape{d.tokens, d.top_k}, stats_dtype(d.dtype), what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::moe_unpermute(d, out.data_ptr(), y_sorted.data_ptr(), weights.data_ptr(),
                                dest.data<int32_t>());
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::moe_unpermute(d, out.data_ptr(), y_sorted.data_ptr(), weights.data<float>(),
                               dest.data<int32_t>(), ctx.stream().cuda_stream());
#endif
}

void moe_unpermute_backward(Context& ctx, const Tensor& dy_sorted, const Tensor& dweights,
                            const Tensor& dout, const Tensor& y_sorted, const Tensor& weights,
                            const Tensor& dest) {
  const char* what = "moe_unpermute_backward";
  const kernels::MoeRowsDims d = rows_dims(ctx, dout, dest, what);
  check_sorted_rows(ctx, dy_sorted, d, what);
  check_sorted_rows(ctx, y_sorted, d, what);
  const DType stats = stats_dtype(d.dtype);
  check_dense(ctx, weights, Shape{d.tokens, d.top_k}, stats, what);
  check_dense(ctx, dweights, Shape{d.tokens, d.top_k}, stats, what);
  if (ctx.device().is_cpu()) {
    kernels::cpu::moe_unpermute_backward(d, dy_sorted.data_ptr(), dweights.data_ptr(),
                                         dout.data_ptr(), y_sorted.data_ptr(),
                                         weights.data_ptr(), dest.data<int32_t>());
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::moe_unpermute_backward(d, dy_sorted.data_ptr(), dweights.data<float>(),
                                        dout.data_ptr(), y_sorted.data_ptr(),
                                        weights.data<float>(), dest.data<int32_t>(),
                                        ctx.stream().cuda_stream());
#endif
}

namespace {

// Auto: experts with more rows run as matmuls of their own (one cuBLASLt call each), the
// rest in one grouped GEMM. Measured on an H200 (bench grouped-matmul, bf16, d 2048): at
// 2048 rows per expert (64 experts, d_ff 1024) one call per expert reached 562 TFLOP/s
// forward against the grouped GEMM's 327; at 1024 rows (128 experts, d_ff 768) the grouped
// GEMM 311 against 258.
constexpr int64_t kGroupedMaxRows = 1536;

}  // namespace

#if FSDP_WITH_CUDA
namespace {

// Whether a CUDA grouped call may take these (contiguous, one dtype) operands.
bool grouped_gemm(Context& ctx, GroupedMatmulMethod method, std::initializer_list<Tensor> operands) {
  if (!ctx.is_cuda() || method != GroupedMatmulMethod::Auto) return false;
  for (const Tensor& t : operands)
    if (!t.is_contiguous() || t.dtype() != operands.begin()->dtype()) return false;
  const DType dt = operands.begin()->dtype();
  return dt == DType::bf16 || dt == DType::f32;
}

kernels::cuda::GroupedMatmulDims grouped_dims(const std::vector<int64_t>& counts, int64_t F,
                                              const Tensor& x) {
  kernels::cuda::GroupedMatmulDims d;
  d.rows = counts;
  d.F = F;
  d.K = x.size(1);
  d.dtype = x.dtype();
  d.max_rows = kGroupedMaxRows;
  return d;
}

}  // namespace
#endif

void moe_grouped_matmul(Context& ctx, const Tensor& y, const Tensor& x, const Tensor& w,
                        const std::vector<int64_t>& counts, GroupedMatmulMethod method) {
  const char* what = "moe_grouped_matmul";
  const int64_t F = check_grouped(ctx, x, w, counts, what);
  check_matrix(ctx, y, what, "y");
  check_shape(y, Shape{x.size(0), F}, what);
  int64_t grouped_rows = 0;  // experts with at most this many rows ran in the grouped call
#if FSDP_WITH_CUDA
  if (grouped_gemm(ctx, method, {y, x, w}) &&
      ctx.extension<kernels::cuda::GroupedBlas>().forward(grouped_dims(counts, F, x), y.data_ptr(),
                                                          x.data_ptr(), w.data_ptr()))
    grouped_rows = kGroupedMaxRows;
#endif
  int64_t begin = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    const int64_t rows = counts[e];
    // No rows: nothing to compute, and a zero-length view is not needed.
    if (rows > grouped_rows)
      matmul(ctx, y.narrow(0, begin, rows), x.narrow(0, begin, rows), w.select(0, int64_t(e)),
             false, true);
    begin += rows;
  }
}

void moe_grouped_matmul_backward(Context& ctx, const Tensor& dx, const Tensor& dw,
                                 const Tensor& dy, const Tensor& x, const Tensor& w,
                                 const std::vector<int64_t>& counts, bool accumulate,
                                 GroupedMatmulMethod method) {
  const char* what = "moe_grouped_matmul_backward";
  const int64_t F = check_grouped(ctx, x, w, counts, what);
  check_matrix(ctx, dy, what, "dy");
  check_shape(dy, Shape{x.size(0), F}, what);
  if (dx.defined()) {
    check_matrix(ctx, dx, what, "dx");
    check_shape(dx, x.shape(), what);
  }
  if (dw.defined()) {
    check_on_ctx(ctx, dw, what);
    check_contiguous(dw, what);
    check_shape(dw, w.shape(), what);
  }
  // An expert that saw no token: its weight gradient is zero.
  if (dw.defined() && !accumulate)
    for (size_t e = 0; e < counts.size(); ++e)
      if (counts[e] == 0) fill(ctx, dw.select(0, int64_t(e)), 0.0);
  // Experts with at most this many rows had that gradient computed by a grouped call.
  int64_t dx_grouped = 0, dw_grouped = 0;
#if FSDP_WITH_CUDA
  if (grouped_gemm(ctx, method, {dy, x, w})) {
    kernels::cuda::GroupedBlas& grouped = ctx.extension<kernels::cuda::GroupedBlas>();
    const kernels::cuda::GroupedMatmulDims gd = grouped_dims(counts, F, x);
    if (dx.defined() && dx.is_contiguous() &&
        grouped.input_grad(gd, dx.data_ptr(), dy.data_ptr(), w.data_ptr()))
      dx_grouped = kGroupedMaxRows;
    if (dw.defined() && grouped.weight_grad(gd, dw.data_ptr(), dw.dtype(), dy.data_ptr(),
                                            x.data_ptr(), accumulate ? 1.0 : 0.0))
      dw_grouped = kGroupedMaxRows;
  }
#endif
  int64_t begin = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    const int64_t rows = counts[e];
    if (rows == 0) continue;
    const Tensor dy_e = dy.narrow(0, begin, rows);  // (rows, F)
    if (dx.defined() && rows > dx_grouped)  // dx_e (rows, K) = dy_e @ w_e
      matmul(ctx, dx.narrow(0, begin, rows), dy_e, w.select(0, int64_t(e)), false, false);
    if (dw.defined() && rows > dw_grouped)  // dw_e (F, K) (+)= dy_e^T @ x_e
      matmul(ctx, dw.select(0, int64_t(e)), dy_e, x.narrow(0, begin, rows), true, false, 1.0,
             accumulate ? 1.0 : 0.0);
    begin += rows;
  }
}

}  // namespace fsdp::ops
