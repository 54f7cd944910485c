// Dispatch of the FP8 ops (kernels/fp8.h).
#include "kernels/fp8.h"

#include <functional>

#include "kernels/activation.h"
#include "kernels/basic.h"
#include "kernels/checks.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/matmul.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/fp8_blocks.h"
#include "kernels/cuda/fp8_rows.h"
#endif

namespace fsdp::ops {
namespace {

using namespace detail;

void check_fp8_matrix(const Context& ctx, const Fp8Matrix& m, const char* what) {
  FSDP_CHECK(m.defined() && m.data.dim() == 2, ShapeError, what, ": FP8 operand must be 2-D, got ",
             m.data.defined() ? m.data.str() : std::string("undefined"));
  check_dense(ctx, m.data, m.data.shape(), DType::u8, what);
  const kernels::Fp8ScaleGrid grid =
      kernels::fp8_scale_grid(m.granularity, m.data.size(0), m.data.size(1));
  check_dense(ctx, m.scale_inv,
              m.granularity == Fp8Granularity::tensor ? Shape{1} : Shape{grid.outer, grid.inner},
              DType::f32, what);
}

// The arguments both casts share: x (R, C) floating and contiguous, at least one layout
// asked for, and the optional column sums (C) beside them.
void check_quantize_args(const Context& ctx, const Tensor& x, bool rows, bool columns,
                         const Tensor& add_column_sums, const char* what,
                         Fp8CastSource source = Fp8CastSource::tensor) {
  check_on_ctx(ctx, x, what);
  check_floating(x, what);
  check_contiguous(x, what);
  FSDP_CHECK(x.dim() == 2, ShapeError, what, ": expected a 2-D (rows, cols) tensor, got ", x.str());
  FSDP_CHECK(rows || columns, ValueError, what, ": asked for neither layout");
  if (!add_column_sums.defined()) return;
  check_on_ctx(ctx, add_column_sums, what);
  check_floating(add_column_sums, what);
  check_contiguous(add_column_sums, what);
  check_shape(add_column_sums, Shape{kernels::fp8_source_cols(source, x.size(1))}, what);
}

// The bias gradient beside a cast: add_column_sums (C) += the column sums of x (R, C). On
// the CPU a pass of its own (add_column_sums_cpu); on CUDA the cast kernel sums each row
// tile of x into partials (tiles, C), a workspace, and then adds them in a fixed order
// (deterministic), so x is read once (column_sums_cuda).
void add_column_sums_cpu(const Tensor& add_column_sums, const Tensor& x) {
  if (!add_column_sums.defined()) return;
  kernels::cpu::bias_backward(add_column_sums.data_ptr(), add_column_sums.dtype(), x.data_ptr(),
                              x.dtype(), x.size(0), x.size(1), true);
}

#if FSDP_WITH_CUDA
// add_column_sums and the partials of a cast of `tiles` row tiles of c columns; `partials`
// holds the workspace (none without add_column_sums).
kernels::cuda::ColumnSums column_sums_cuda(Context& ctx, const Tensor& add_column_sums,
                                           int64_t tiles, int64_t c, Tensor& partials) {
  if (!add_column_sums.defined()) return {};
  partials = ctx.empty(Shape{tiles, c}, DType::f32);
  return {add_column_sums.data_ptr(), add_column_sums.dtype(), partials.data<float>()};
}
#endif

// An (rows, k) FP8 matrix (K = k) and its grid of inverse scales, scaled by block or by row
// (kernels/fp8_format.h); the grid's padding holds 1s, which the cast kernels do not write.
Fp8Matrix scaled_matrix(Context& ctx, int64_t rows, int64_t k, Fp8Format format, Fp8Granularity g) {
  const kernels::Fp8ScaleGrid grid = kernels::fp8_scale_grid(g, rows, k);
  // The entries along the grid's inner size that hold scales: its rows' (1x128, row) or
  // its blocks' along K (128x128).
  const int64_t used = g == Fp8Granularity::block_128x128 ? kernels::fp8_blocks(k) : rows;
  const Shape shape{grid.outer, grid.inner};
  return Fp8Matrix{ctx.empty(Shape{rows, k}, DType::u8),
                   used < grid.inner ? ops::full(ctx, shape, DType::f32, 1.0) : ctx.empty(shape, DType::f32),
                   format, g};
}

// Scaled by block or by row: one inverse scale per block or per row (a grid of them).
bool block_scaled(const Fp8Matrix& m) { return m.granularity != Fp8Granularity::tensor; }
bool row_scaled(const Fp8Matrix& m) { return m.granularity == Fp8Granularity::row; }

const uint8_t* bytes(const Fp8Matrix& m) { return static_cast<const uint8_t*>(m.data.data_ptr()); }
const float* scales(const Fp8Matrix& m) { return static_cast<const float*>(m.scale_inv.data_ptr()); }

// The block- or row-scaled product (both operands so): the CPU's simulation, or cuBLASLt's
// block-scaled or outer-vector kernels (kernels/cuda/fp8.h).
void fp8_block_matmul(Context& ctx, const Tensor& out, const Fp8Matrix& a, const Fp8Matrix& b,
                      double alpha, double beta, const Tensor& bias, Epilogue epilogue,
                      const Tensor& aux) {
  const char* what = "fp8_matmul";
  const int64_t m = a.data.size(0), k = a.data.size(1), n = b.data.size(0);
  FSDP_CHECK(block_scaled(a) && block_scaled(b) && row_scaled(a) == row_scaled(b), ValueError,
             what, ": operands scaled ", fp8_granularity_name(a.granularity), " and ",
             fp8_granularity_name(b.granularity), "; a block-scaled product needs both "
             "block-scaled, a row-scaled one both row-scaled");
  FSDP_CHECK(!(a.granularity == Fp8Granularity::block_128x128 &&
               b.granularity == Fp8Granularity::block_128x128),
             ValueError, what, ": 128x128 x 128x128 block-scaled products are not offered by "
             "cuBLASLt; one operand must be 1x128");
  FSDP_CHECK(row_scaled(a) || k % kernels::kFp8Block == 0, ShapeError, what, ": block-scaled "
             "operands need K a multiple of 128, got ", a.data.str(), " and ", b.data.str());
  if (ctx.device().is_cpu()) {
    kernels::cpu::fp8_matmul_blocks(m, n, k, out.data_ptr(), out.dtype(), bytes(a), a.format,
                                    a.granularity, scales(a), bytes(b), b.format, b.granularity,
                                    scales(b), alpha, beta, data_or_null(bias),
                                    data_or_null(aux), epilogue);
    return;
  }
#if FSDP_WITH_CUDA
  ScratchTensors scratch(ctx);
  kernels::cuda::fp8_matmul_blocks(ctx.extension<kernels::cuda::Blas>(), m, n, k, out.data_ptr(),
                                   out.dtype(), bytes(a), a.format, a.granularity, scales(a),
                                   bytes(b), b.format, b.granularity, scales(b), alpha, beta,
                                   data_or_null(bias), data_or_null(aux), epilogue,
                                   std::ref(scratch), ctx.stream().cuda_stream());
#endif
}

}  // namespace

bool fp8_available(Context& ctx, std::string* why) {
  if (ctx.device().is_cpu()) return true;
#if FSDP_WITH_CUDA
  const int cc = kernels::cuda::compute_capability(ctx.device().index);
  if (cc >= 89) return true;
  if (why)
    *why = "GPU " + std::to_string(ctx.device().index) + " has compute capability " +
           std::to_string(cc / 10) + "." + std::to_string(cc % 10) +
           "; FP8 tensor cores need 8.9 (Ada) or 9.0 (Hopper) or newer";
#endif
  return false;
}

namespace {

// A cast's source (kernels/fp8_format.h): x itself, or values computed from an activation's
// input x (and dout, the gradient at its output).
struct CastSource {
  Fp8CastSource kind = Fp8CastSource::tensor;
  Tensor x, dout;
};

void check_source(const Context& ctx, const CastSource& s, const char* what) {
  check_on_ctx(ctx, s.x, what);
  check_floating(s.x, what);
  check_contiguous(s.x, what);
  FSDP_CHECK(s.x.dim() == 2, ShapeError, what, ": expected a 2-D (rows, cols) tensor, got ", s.x.str());
  if (s.kind == Fp8CastSource::tensor) return;
  const bool swiglu = s.kind != Fp8CastSource::gelu_grad;
  FSDP_CHECK(!swiglu || s.x.size(1) % 2 == 0, ShapeError, what, ": the SwiGLU input ", s.x.str(),
             " does not have an even number of columns");
  if (s.kind == Fp8CastSource::swiglu) return;
  check_dense(ctx, s.dout, Shape{s.x.size(0), swiglu ? s.x.size(1) / 2 : s.x.size(1)}, s.x.dtype(),
              what);
}

// The (R, C) of a source's values.
int64_t source_rows(const CastSource& s) { return s.x.size(0); }
int64_t source_cols(const CastSource& s) { return kernels::fp8_source_cols(s.kind, s.x.size(1)); }

// On the CPU a computed source is computed (as ops::swiglu_forward, gelu_backward and
// swiglu_backward store it) and then cast: the reference the CUDA kernels' fused read equals.
// The values come from an allocator of their own, not the context's: the GPU holds no such
// buffer, and a CPU rank's peak stands for the GPU's (tests/train/memory_plan_test.cc).
Tensor cpu_values(Context& ctx, const CastSource& s) {
  if (s.kind == Fp8CastSource::tensor) return s.x;
  const Tensor v = Tensor::empty(Shape{source_rows(s), source_cols(s)}, s.x.dtype(),
                                 std::make_shared<HostAllocator>(), ctx.stream());
  if (s.kind == Fp8CastSource::swiglu)
    swiglu_forward(ctx, v, s.x);
  else if (s.kind == Fp8CastSource::gelu_grad)
    gelu_backward(ctx, v, s.dout, s.x);
  else
    swiglu_backward(ctx, v, s.dout, s.x);
  return v;
}

void amax_of(Context& ctx, const Tensor& amax, const CastSource& s, const char* what) {
  check_dense(ctx, amax, Shape{1}, DType::f32, what);
  if (ctx.device().is_cpu()) {
    const Tensor v = cpu_values(ctx, s);
    *static_cast<float*>(amax.data_ptr()) = kernels::cpu::fp8_amax(v.data_ptr(), v.dtype(), v.numel());
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::fp8_amax(static_cast<float*>(amax.data_ptr()), s.x.data_ptr(), data_or_null(s.dout),
                          s.kind, s.x.dtype(), source_rows(s), source_cols(s), ctx.stream().cuda_stream());
#endif
}

Fp8Quantized quantize_tensorwise(Context& ctx, const CastSource& s, const Tensor& amax,
                                 Fp8Format format, bool rows, bool columns,
                                 const Tensor& add_column_sums, const Tensor& record_amax,
                                 const char* what) {
  check_quantize_args(ctx, s.x, rows, columns, add_column_sums, what, s.kind);
  check_dense(ctx, amax, Shape{1}, DType::f32, what);
  const int64_t r = source_rows(s), c = source_cols(s);
  if (record_amax.defined()) check_dense(ctx, record_amax, Shape{1}, DType::f32, what);
  auto* record = static_cast<float*>(data_or_null(record_amax));
  Fp8Quantized q;
  const Tensor scale_inv = ctx.empty(Shape{1}, DType::f32);
  if (rows) q.rows = Fp8Matrix{ctx.empty(Shape{r, c}, DType::u8), scale_inv, format};
  if (columns) q.columns = Fp8Matrix{ctx.empty(Shape{c, r}, DType::u8), scale_inv, format};
  auto* qp = rows ? static_cast<uint8_t*>(q.rows.data.data_ptr()) : nullptr;
  auto* qtp = columns ? static_cast<uint8_t*>(q.columns.data.data_ptr()) : nullptr;
  auto* sinv = static_cast<float*>(scale_inv.data_ptr());
  if (r == 0 || c == 0) {
    ops::fill(ctx, scale_inv, 1.0);
    return q;
  }
  if (ctx.device().is_cpu()) {
    const Tensor v = cpu_values(ctx, s);
    kernels::cpu::fp8_quantize(v.data_ptr(), v.dtype(), r, c,
                               *static_cast<const float*>(amax.data_ptr()), format, qp, qtp, sinv,
                               record);
    add_column_sums_cpu(add_column_sums, v);
    return q;
  }
#if FSDP_WITH_CUDA
  Tensor partials;
  kernels::cuda::fp8_quantize(
      s.x.data_ptr(), data_or_null(s.dout), s.kind, s.x.dtype(), r, c,
      static_cast<const float*>(amax.data_ptr()), format, qp, qtp, sinv,
      column_sums_cuda(ctx, add_column_sums, kernels::cuda::fp8_column_sum_tiles(r), c, partials),
      record, ctx.stream().cuda_stream());
#endif
  return q;
}

CastSource activation_source(Fp8CastSource kind, const Tensor& dout, const Tensor& x,
                             const char* what) {
  FSDP_CHECK(kind != Fp8CastSource::tensor, ValueError, what, ": an activation's source "
             "(swiglu, gelu_grad or swiglu_grad) expected");
  FSDP_CHECK(x.defined(), ValueError, what, ": undefined activation input");
  FSDP_CHECK(dout.defined() == (kind != Fp8CastSource::swiglu), ValueError, what,
             kind == Fp8CastSource::swiglu ? ": the activation itself takes no gradient"
                                           : ": undefined gradient at the activation's output");
  return CastSource{kind, x, dout};
}

}  // namespace

void fp8_amax(Context& ctx, const Tensor& amax, const Tensor& x) {
  const char* what = "fp8_amax";
  check_on_ctx(ctx, x, what);
  check_floating(x, what);
  check_contiguous(x, what);
  // Any shape: its elements as one row.
  amax_of(ctx, amax, CastSource{Fp8CastSource::tensor, x.view(Shape{1, x.numel()}), Tensor()}, what);
}

void fp8_amax_activation(Context& ctx, const Tensor& amax, Fp8CastSource kind,
                              const Tensor& dout, const Tensor& x) {
  const char* what = "fp8_amax_activation";
  const CastSource s = activation_source(kind, dout, x, what);
  check_source(ctx, s, what);
  amax_of(ctx, amax, s, what);
}

Fp8Quantized fp8_quantize(Context& ctx, const Tensor& x, const Tensor& amax, Fp8Format format,
                          bool rows, bool columns, const Tensor& add_column_sums,
                          const Tensor& record_amax) {
  return quantize_tensorwise(ctx, CastSource{Fp8CastSource::tensor, x, Tensor()}, amax, format,
                             rows, columns, add_column_sums, record_amax, "fp8_quantize");
}

Fp8Quantized fp8_quantize_activation(Context& ctx, Fp8CastSource kind, const Tensor& dout,
                                          const Tensor& x, const Tensor& amax, Fp8Format format,
                                          bool rows, bool columns, const Tensor& add_column_sums,
                                          const Tensor& record_amax) {
  const char* what = "fp8_quantize_activation";
  const CastSource s = activation_source(kind, dout, x, what);
  check_source(ctx, s, what);
  return quantize_tensorwise(ctx, s, amax, format, rows, columns, add_column_sums, record_amax, what);
}

void fp8_quantize_flat(Context& ctx, const Tensor& q, const Tensor& x, const Tensor& amax,
                       Fp8Format format) {
  const char* what = "fp8_quantize_flat";
  check_on_ctx(ctx, x, what);
  check_floating(x, what);
  check_contiguous(x, what);
  check_dense(ctx, q, q.shape(), DType::u8, what);
  FSDP_CHECK(q.numel() == x.numel(), ShapeError, what, ": ", q.str(), " does not have the ",
             x.numel(), " elements of ", x.str());
  check_dense(ctx, amax, Shape{1}, DType::f32, what);
  const int64_t n = x.numel();
  if (n == 0) return;
  auto* qp = static_cast<uint8_t*>(q.data_ptr());
  if (ctx.device().is_cpu()) {
    float scale_inv = 0;
    kernels::cpu::fp8_quantize(x.data_ptr(), x.dtype(), 1, n,
                               *static_cast<const float*>(amax.data_ptr()), format, qp, nullptr,
                               &scale_inv);
    return;
  }
#if FSDP_WITH_CUDA
  const Tensor scale_inv = ctx.empty(Shape{1}, DType::f32);  // not needed: fp8_scale_inverses
  kernels::cuda::fp8_quantize_flat(x.data_ptr(), x.dtype(), n,
                                   static_cast<const float*>(amax.data_ptr()), format, qp,
                                   scale_inv.data<float>(), ctx.stream().cuda_stream());
#endif
}

void fp8_scale_inverses(Context& ctx, const Tensor& scale_inv, const Tensor& amax, Fp8Format format) {
  const char* what = "fp8_scale_inverses";
  check_dense(ctx, amax, amax.shape(), DType::f32, what);
  check_dense(ctx, scale_inv, amax.shape(), DType::f32, what);
  FSDP_CHECK(amax.dim() == 1, ShapeError, what, ": amax must be 1-D, got ", amax.str());
  const auto* a = static_cast<const float*>(amax.data_ptr());
  auto* s = static_cast<float*>(scale_inv.data_ptr());
  if (ctx.device().is_cpu()) {
    kernels::cpu::fp8_scale_inverses(a, amax.numel(), format, s);
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::fp8_scale_inverses(a, amax.numel(), format, s, ctx.stream().cuda_stream());
#endif
}

Fp8Quantized fp8_quantize_blocks(Context& ctx, const Tensor& x, Fp8Format format,
                                 Fp8Granularity granularity, bool rows, bool columns,
                                 const Tensor& add_column_sums) {
  const char* what = "fp8_quantize_blocks";
  check_quantize_args(ctx, x, rows, columns, add_column_sums, what);
  FSDP_CHECK(granularity != Fp8Granularity::tensor, ValueError, what,
             ": tensor-wise scaling goes through fp8_quantize");
  const int64_t r = x.size(0), c = x.size(1);
  Fp8Quantized q;
  if (rows) q.rows = scaled_matrix(ctx, r, c, format, granularity);
  if (columns) q.columns = scaled_matrix(ctx, c, r, format, granularity);
  if (r == 0 || c == 0) return q;
  auto* qp = rows ? static_cast<uint8_t*>(q.rows.data.data_ptr()) : nullptr;
  auto* qs = rows ? static_cast<float*>(q.rows.scale_inv.data_ptr()) : nullptr;
  auto* qtp = columns ? static_cast<uint8_t*>(q.columns.data.data_ptr()) : nullptr;
  auto* qts = columns ? static_cast<float*>(q.columns.scale_inv.data_ptr()) : nullptr;
  if (ctx.device().is_cpu()) {
    kernels::cpu::fp8_quantize_blocks(x.data_ptr(), x.dtype(), r, c, format, granularity, qp, qs,
                                      qtp, qts);
    add_column_sums_cpu(add_column_sums, x);
    return q;
  }
#if FSDP_WITH_CUDA
  Tensor partials;
  kernels::cuda::fp8_quantize_blocks(
      x.data_ptr(), x.dtype(), r, c, format, granularity, qp, qs, qtp, qts,
      column_sums_cuda(ctx, add_column_sums, kernels::cuda::fp8_block_column_sum_tiles(r), c,
                       partials),
      ctx.stream().cuda_stream());
#endif
  return q;
}

namespace {

// amax (n) f32 of x (R, C) along one axis (rows: one per row; else one per column).
void fp8_axis_amax(Context& ctx, const Tensor& amax, const Tensor& x, bool per_row, const char* what) {
  check_on_ctx(ctx, x, what);
  check_floating(x, what);
  check_contiguous(x, what);
  FSDP_CHECK(x.dim() == 2, ShapeError, what, ": expected a 2-D (rows, cols) tensor, got ", x.str());
  const int64_t r = x.size(0), c = x.size(1);
  check_dense(ctx, amax, Shape{per_row ? r : c}, DType::f32, what);
  auto* out = static_cast<float*>(amax.data_ptr());
  if (ctx.device().is_cpu()) {
    if (per_row)
      kernels::cpu::fp8_row_amax(x.data_ptr(), x.dtype(), r, c, out);
    else
      kernels::cpu::fp8_column_amax(x.data_ptr(), x.dtype(), r, c, out);
    return;
  }
#if FSDP_WITH_CUDA
  if (per_row)
    kernels::cuda::fp8_row_amax(x.data_ptr(), x.dtype(), r, c, out, ctx.stream().cuda_stream());
  else
    kernels::cuda::fp8_column_amax(x.data_ptr(), x.dtype(), r, c, out, ctx.stream().cuda_stream());
#endif
}

}  // namespace

void fp8_row_amax(Context& ctx, const Tensor& amax, const Tensor& x) {
  fp8_axis_amax(ctx, amax, x, true, "fp8_row_amax");
}

void fp8_column_amax(Context& ctx, const Tensor& amax, const Tensor& x) {
  fp8_axis_amax(ctx, amax, x, false, "fp8_column_amax");
}

Fp8Quantized fp8_quantize_rowwise(Context& ctx, const Tensor& x, Fp8Format format,
                                  const Tensor& row_amax, const Tensor& column_amax,
                                  const Tensor& add_column_sums) {
  const char* what = "fp8_quantize_rowwise";
  const bool rows = row_amax.defined(), columns = column_amax.defined();
  check_quantize_args(ctx, x, rows, columns, add_column_sums, what);
  const int64_t r = x.size(0), c = x.size(1);
  if (rows) check_dense(ctx, row_amax, Shape{r}, DType::f32, what);
  if (columns) check_dense(ctx, column_amax, Shape{c}, DType::f32, what);
  Fp8Quantized q;
  if (rows) q.rows = scaled_matrix(ctx, r, c, format, Fp8Granularity::row);
  if (columns) q.columns = scaled_matrix(ctx, c, r, format, Fp8Granularity::row);
  if (r == 0 || c == 0) return q;
  auto* qp = rows ? static_cast<uint8_t*>(q.rows.data.data_ptr()) : nullptr;
  auto* qs = rows ? static_cast<float*>(q.rows.scale_inv.data_ptr()) : nullptr;
  auto* qtp = columns ? static_cast<uint8_t*>(q.columns.data.data_ptr()) : nullptr;
  auto* qts = columns ? static_cast<float*>(q.columns.scale_inv.data_ptr()) : nullptr;
  const auto* ra = static_cast<const float*>(data_or_null(row_amax));
  const auto* ca = static_cast<const float*>(data_or_null(column_amax));
  if (ctx.device().is_cpu()) {
    kernels::cpu::fp8_quantize_rowwise(x.data_ptr(), x.dtype(), r, c, format, ra, qp, qs, ca, qtp, qts);
    add_column_sums_cpu(add_column_sums, x);
    return q;
  }
#if FSDP_WITH_CUDA
  Tensor partials;
  kernels::cuda::fp8_quantize_rowwise(
      x.data_ptr(), x.dtype(), r, c, format, ra, qp, qs, ca, qtp, qts,
      column_sums_cuda(ctx, add_column_sums, kernels::cuda::fp8_column_sum_tiles(r), c, partials),
      ctx.stream().cuda_stream());
#endif
  return q;
}

void fp8_update_amax_histories(Context& ctx, const Tensor& history, const Tensor& step_amax,
                               const Tensor& scale_amax, bool roll, bool use_max,
                               float margin_factor) {
  const char* what = "fp8_update_amax_histories";
  FSDP_CHECK(history.defined() && history.dim() == 3, ShapeError, what,
             ": history must be (layers, len, operands), got ",
             history.defined() ? history.str() : std::string("undefined"));
  const int64_t layers = history.size(0), len = history.size(1), width = history.size(2);
  FSDP_CHECK(len > 0, ShapeError, what, ": the history has no entries");
  check_dense(ctx, history, history.shape(), DType::f32, what);
  check_dense(ctx, step_amax, Shape{layers, width}, DType::f32, what);
  check_dense(ctx, scale_amax, Shape{layers, width}, DType::f32, what);
  auto* h = static_cast<float*>(history.data_ptr());
  const auto* step = static_cast<const float*>(step_amax.data_ptr());
  auto* scale = static_cast<float*>(scale_amax.data_ptr());
  if (ctx.device().is_cpu()) {
    kernels::cpu::fp8_update_amax_histories(h, step, scale, layers, len, width, roll, use_max,
                                            margin_factor);
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::fp8_update_amax_histories(h, step, scale, layers, len, width, roll, use_max,
                                           margin_factor, ctx.stream().cuda_stream());
#endif
}

void fp8_matmul(Context& ctx, const Tensor& out, const Fp8Matrix& a, const Fp8Matrix& b,
                double alpha, double beta, const Tensor& bias, Epilogue epilogue,
                const Tensor& aux, bool fast_accum) {
  const char* what = "fp8_matmul";
  check_fp8_matrix(ctx, a, what);
  check_fp8_matrix(ctx, b, what);
  const int64_t m = a.data.size(0), k = a.data.size(1), n = b.data.size(0);
  FSDP_CHECK(b.data.size(1) == k, ShapeError, what, ": a ", a.data.str(), " and b ", b.data.str(),
             " must both be K-major: (M, K) and (N, K)");
  FSDP_CHECK(!(a.format == Fp8Format::e5m2 && b.format == Fp8Format::e5m2), DTypeError, what,
             ": e5m2 x e5m2 products do not exist on FP8 tensor cores; one operand must be e4m3");
  check_on_ctx(ctx, out, what);
  check_floating(out, what);
  check_dense(ctx, out, Shape{m, n}, out.dtype(), what);
  if (bias.defined()) check_dense(ctx, bias, Shape{n}, out.dtype(), "fp8_matmul bias");
  const bool gelu = epilogue == Epilogue::Gelu, dgelu = epilogue == Epilogue::DGelu;
  FSDP_CHECK(epilogue == Epilogue::None || gelu || dgelu, ValueError, what,
             ": the epilogue must be None, Gelu or DGelu");
  if (aux.defined()) check_dense(ctx, aux, Shape{m, n}, out.dtype(), "fp8_matmul aux");
  FSDP_CHECK(!dgelu || (aux.defined() && !bias.defined()), ValueError, what,
             ": DGelu reads the GELU input from aux and takes no bias");
  FSDP_CHECK(epilogue == Epilogue::None || beta == 0.0, ValueError, what,
             ": a GELU epilogue needs beta = 0");
  if (block_scaled(a) || block_scaled(b)) {
    FSDP_CHECK(!fast_accum, ValueError, what, ": fast accumulation is not offered with "
               "block- or row-scaled operands");
    fp8_block_matmul(ctx, out, a, b, alpha, beta, bias, epilogue, aux);
    return;
  }
  if (ctx.device().is_cpu()) {
    kernels::cpu::fp8_matmul(m, n, k, out.data_ptr(), out.dtype(), bytes(a), a.format, *scales(a),
                             bytes(b), b.format, *scales(b), alpha, beta, data_or_null(bias),
                             data_or_null(aux), epilogue);
    return;
  }
#if FSDP_WITH_CUDA
  ScratchTensors scratch(ctx);
  kernels::cuda::fp8_matmul(ctx.extension<kernels::cuda::Blas>(), m, n, k, out.data_ptr(),
                            out.dtype(), bytes(a), a.format, scales(a), bytes(b), b.format,
                            scales(b), alpha, beta, data_or_null(bias), data_or_null(aux),
                            epilogue, fast_accum, std::ref(scratch), ctx.stream().cuda_stream());
#endif
}

}  // namespace fsdp::ops
