// Dispatch of the fused softmax cross-entropy (kernels/nn_ops.h).
#include "kernels/checks.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/nn_ops.h"

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

void cross_entropy_backward(Context& ctx, const Tensor& dlogits, const Tensor& logits,
                            const Tensor& lse, const Tensor& targets, int64_t vocab_size,
                            double dloss) {
  const char* what = "cross_entropy_backward";
  const kernels::CrossEntropyDims d = check_logits(ctx, logits, targets, vocab_size, what);
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

}  // namespace fsdp::ops
