// Dispatch of the fused softmax cross-entropy (kernels/cross_entropy.h).
#include "kernels/cross_entropy.h"

#include <algorithm>

#include "kernels/checks.h"
#include "kernels/cpu/cross_entropy.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/cross_entropy.h"
#endif

namespace fsdp::ops {
namespace {

using namespace detail;

// logits (..., Vp) contiguous floating; targets (rows) i32; 0 < vocab_size <= Vp.
kernels::CrossEntropyDims check_logits(Context& ctx, const Tensor& logits, const Tensor& targets,
                                       int64_t vocab_size, const char* what) {
  check_on_ctx(ctx, logits, what);
  check_floating(logits, what);
  check_contiguous(logits, what);
  FSDP_CHECK(logits.dim() >= 1, ShapeError, what, ": logits need a class dimension, got ", logits.str());
  kernels::CrossEntropyDims d;
  d.padded_vocab = logits.size(-1);
  d.vocab = vocab_size;
  d.rows = d.padded_vocab ? logits.numel() / d.padded_vocab : 0;
  d.dtype = logits.dtype();
  FSDP_CHECK(vocab_size > 0 && vocab_size <= d.padded_vocab, ValueError, what, ": vocab_size ",
             vocab_size, " must lie in [1, ", d.padded_vocab, "] for ", logits.str());
  check_on_ctx(ctx, targets, what);
  check_dtype(targets, DType::i32, what);
  check_contiguous(targets, what);
  FSDP_CHECK(targets.numel() == d.rows, ShapeError, what, ": ", targets.str(), " for ", d.rows,
             " rows of logits");
  return d;
}

void check_row_stats(Context& ctx, const Tensor& t, const kernels::CrossEntropyDims& d,
                     const char* what) {
  check_on_ctx(ctx, t, what);
  check_dtype(t, stats_dtype(d.dtype), what);
  check_contiguous(t, what);
  FSDP_CHECK(t.numel() == d.rows, ShapeError, what, ": ", t.str(), " needs one value per row (",
             d.rows, ")");
}

// A vocabulary-parallel shard: logits (..., Vl) hold classes [vocab_begin, vocab_begin + Vl)
// of vocab_size (any of them may be padding).
kernels::CrossEntropyDims check_shard(Context& ctx, const Tensor& logits, const Tensor& targets,
                                      int64_t vocab_size, int64_t vocab_begin, const char* what) {
  FSDP_CHECK(vocab_begin >= 0 && vocab_size > 0, ValueError, what, ": a shard from class ",
             vocab_begin, " of a vocabulary of ", vocab_size);
  // Checked as a whole row of max(vocab_size, Vl) classes, then narrowed to the shard.
  const int64_t vl = logits.dim() >= 1 ? logits.size(-1) : 0;
  kernels::CrossEntropyDims d =
      check_logits(ctx, logits, targets, std::min(vocab_size, std::max<int64_t>(vl, 1)), what);
  d.vocab = vocab_size;
  d.vocab_begin = vocab_begin;
  return d;
}

}  // namespace

void cross_entropy_forward(Context& ctx, const Tensor& losses, const Tensor& lse,
                           const Tensor& logits, const Tensor& targets, int64_t vocab_size) {
  const char* what = "cross_entropy_forward";
  const kernels::CrossEntropyDims d = check_logits(ctx, logits, targets, vocab_size, what);
  check_row_stats(ctx, losses, d, what);
  check_row_stats(ctx, lse, d, what);
  const int32_t* t = targets.data<int32_t>();
  if (ctx.device().is_cpu()) {
    kernels::cpu::cross_entropy_forward(d, losses.data_ptr(), lse.data_ptr(), logits.data_ptr(), t);
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::cross_entropy_forward(d, static_cast<float*>(losses.data_ptr()),
                                       static_cast<float*>(lse.data_ptr()), logits.data_ptr(), t,
                                       ctx.stream().cuda_stream());
#endif
}

namespace {

// The backward kernel for checked dims (whole rows or a shard's).
void run_backward(Context& ctx, const kernels::CrossEntropyDims& d, const Tensor& dlogits,
                  const Tensor& logits, const Tensor& lse, const Tensor& targets, double dloss,
                  const char* what) {
  check_row_stats(ctx, lse, d, what);
  check_dense(ctx, dlogits, logits.shape(), logits.dtype(), what);
  const int32_t* t = targets.data<int32_t>();
  if (ctx.device().is_cpu()) {
    kernels::cpu::cross_entropy_backward(d, dlogits.data_ptr(), logits.data_ptr(), lse.data_ptr(),
                                         t, dloss);
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::cross_entropy_backward(d, dlogits.data_ptr(), logits.data_ptr(),
                                        static_cast<const float*>(lse.data_ptr()), t, dloss,
                                        ctx.stream().cuda_stream());
#endif
}

}  // namespace

void cross_entropy_backward(Context& ctx, const Tensor& dlogits, const Tensor& logits,
                            const Tensor& lse, const Tensor& targets, int64_t vocab_size,
                            double dloss) {
  const char* what = "cross_entropy_backward";
  run_backward(ctx, check_logits(ctx, logits, targets, vocab_size, what), dlogits, logits, lse,
               targets, dloss, what);
}

void cross_entropy_forward_backward(Context& ctx, const Tensor& losses, const Tensor& logits,
                                    const Tensor& targets, int64_t vocab_size, double dloss,
                                    bool write_grad) {
  const char* what = "cross_entropy_forward_backward";
  const kernels::CrossEntropyDims d = check_logits(ctx, logits, targets, vocab_size, what);
  check_row_stats(ctx, losses, d, what);
  const int32_t* t = targets.data<int32_t>();
  if (ctx.device().is_cpu()) {
    kernels::cpu::cross_entropy_forward_backward(d, losses.data_ptr(), logits.data_ptr(), t,
                                                 dloss, write_grad);
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::cross_entropy_forward_backward(d, static_cast<float*>(losses.data_ptr()),
                                                logits.data_ptr(), t, dloss, write_grad,
                                                ctx.stream().cuda_stream());
#endif
}

void cross_entropy_shard_stats(Context& ctx, const Tensor& partials, const Tensor& logits,
                               const Tensor& targets, int64_t vocab_size, int64_t vocab_begin) {
  const char* what = "cross_entropy_shard_stats";
  const kernels::CrossEntropyDims d =
      check_shard(ctx, logits, targets, vocab_size, vocab_begin, what);
  check_dense(ctx, partials, Shape{3, d.rows}, stats_dtype(d.dtype), what);
  const int32_t* t = targets.data<int32_t>();
  if (ctx.device().is_cpu()) {
    kernels::cpu::cross_entropy_shard_stats(d, partials.data_ptr(), logits.data_ptr(), t);
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::cross_entropy_shard_stats(d, static_cast<float*>(partials.data_ptr()),
                                           logits.data_ptr(), t, ctx.stream().cuda_stream());
#endif
}

void cross_entropy_merge_shards(Context& ctx, const Tensor& losses, const Tensor& lse,
                                const Tensor& partials, const Tensor& targets) {
  const char* what = "cross_entropy_merge_shards";
  check_on_ctx(ctx, partials, what);
  check_floating(partials, what);
  check_contiguous(partials, what);
  FSDP_CHECK(partials.dim() == 3 && partials.size(1) == 3, ShapeError, what,
             ": partials must be (shards, 3, rows), got ", partials.str());
  const int64_t shards = partials.size(0), rows = partials.size(2);
  const DType sd = partials.dtype();
  FSDP_CHECK(sd == DType::f32 || sd == DType::f64, DTypeError, what,
             ": partials must be f32 or f64, got ", partials.str());
  check_dense(ctx, losses, Shape{rows}, sd, what);
  check_dense(ctx, lse, Shape{rows}, sd, what);
  check_on_ctx(ctx, targets, what);
  check_dtype(targets, DType::i32, what);
  check_contiguous(targets, what);
  FSDP_CHECK(targets.numel() == rows, ShapeError, what, ": ", targets.str(), " for ", rows, " rows");
  const int32_t* t = targets.data<int32_t>();
  if (ctx.device().is_cpu()) {
    kernels::cpu::cross_entropy_merge_shards(rows, shards, sd, losses.data_ptr(), lse.data_ptr(),
                                             partials.data_ptr(), t);
    return;
  }
#if FSDP_WITH_CUDA
  FSDP_CHECK(sd == DType::f32, DTypeError, what, ": CUDA partials are f32, got ", partials.str());
  kernels::cuda::cross_entropy_merge_shards(rows, shards, static_cast<float*>(losses.data_ptr()),
                                            static_cast<float*>(lse.data_ptr()),
                                            static_cast<const float*>(partials.data_ptr()), t,
                                            ctx.stream().cuda_stream());
#endif
}

void cross_entropy_shard_backward(Context& ctx, const Tensor& dlogits, const Tensor& logits,
                                  const Tensor& lse, const Tensor& targets, int64_t vocab_size,
                                  int64_t vocab_begin, double dloss) {
  const char* what = "cross_entropy_shard_backward";
  run_backward(ctx, check_shard(ctx, logits, targets, vocab_size, vocab_begin, what), dlogits,
               logits, lse, targets, dloss, what);
}

}  // namespace fsdp::ops
