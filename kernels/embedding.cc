// Dispatch of the token and position embeddings (kernels/embedding.h).
#include "kernels/embedding.h"

#include "kernels/checks.h"
#include "kernels/cpu/embedding.h"

#if FSDP_WITH_CUDA
#include "kernels/cuda/embedding.h"
#endif

namespace fsdp::ops {
namespace {

using namespace detail;

// idx (B, T) i32 contiguous; table (V, C) contiguous floating; optional positions (T' >= T, C).
kernels::EmbeddingDims check_embedding(Context& ctx, const Tensor& idx, const Tensor& table,
                                       const Tensor& positions, const VocabShard& shard,
                                       const char* what) {
  check_on_ctx(ctx, idx, what);
  check_dtype(idx, DType::i32, what);
  check_contiguous(idx, what);
  FSDP_CHECK(idx.dim() == 2, ShapeError, what, ": token ids must be (B, T), got ", idx.str());
  check_on_ctx(ctx, table, what);
  check_floating(table, what);
  check_contiguous(table, what);
  FSDP_CHECK(table.dim() == 2, ShapeError, what, ": the token table must be (V, C), got ", table.str());
  kernels::EmbeddingDims d;
  d.batch = idx.size(0);
  d.seq = idx.size(1);
  d.vocab = table.size(0);
  d.channels = table.size(1);
  d.vocab_begin = shard.begin;
  d.vocab_total = shard.total ? shard.total : d.vocab;
  FSDP_CHECK(d.vocab_begin >= 0 && d.vocab_begin + d.vocab <= d.vocab_total, ShapeError, what,
             ": a table of ", d.vocab, " rows from id ", d.vocab_begin, " does not fit a vocabulary of ",
             d.vocab_total);
  if (positions.defined()) {
    check_on_ctx(ctx, positions, what);
    check_dtype(positions, table.dtype(), what);
    check_contiguous(positions, what);
    FSDP_CHECK(positions.dim() == 2 && positions.size(0) >= d.seq &&
                   positions.size(1) == d.channels,
               ShapeError, what, ": the position table must be (T' >= ", d.seq, ", ", d.channels,
               "), got ", positions.str());
  }
  return d;
}

}  // namespace

void embedding_forward(Context& ctx, const Tensor& out, const Tensor& idx, const Tensor& wte,
                       const Tensor& wpe, const VocabShard& shard) {
  const char* what = "embedding_forward";
  kernels::EmbeddingDims d = check_embedding(ctx, idx, wte, wpe, shard, what);
  d.dtype = wte.dtype();
  d.out_dtype = out.defined() ? out.dtype() : wte.dtype();
  const bool wide_out =
      d.out_dtype == DType::f32 && d.dtype == DType::bf16 && !ctx.device().is_cpu();
  FSDP_CHECK(d.out_dtype == d.dtype || wide_out, DTypeError, what, ": output ", out.str(),
             " for a ", dtype_name(d.dtype), " table (the output has the table's dtype, or "
             "f32 beside bf16 tables on CUDA)");
  check_dense(ctx, out, Shape{d.batch, d.seq, d.channels}, d.out_dtype, what);
  const int32_t* ids = idx.data<int32_t>();
  if (ctx.device().is_cpu()) {
    kernels::cpu::embedding_forward(d, out.data_ptr(), ids, wte.data_ptr(), data_or_null(wpe));
    return;
  }
#if FSDP_WITH_CUDA
  kernels::cuda::embedding_forward(d, out.data_ptr(), ids, wte.data_ptr(), data_or_null(wpe),
                                   ctx.stream().cuda_stream());
#endif
}

void embedding_backward(Context& ctx, const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                        const Tensor& idx, const VocabShard& shard) {
  const char* what = "embedding_backward";
  kernels::EmbeddingDims d = check_embedding(ctx, idx, dwte, dwpe, shard, what);
  d.grad_dtype = dwte.dtype();
  check_on_ctx(ctx, dout, what);
  check_floating(dout, what);
  check_contiguous(dout, what);
  check_shape(dout, Shape{d.batch, d.seq, d.channels}, what);
  d.dtype = dout.dtype();
  const int32_t* ids = idx.data<int32_t>();
  if (ctx.device().is_cpu()) {
    kernels::cpu::embedding_backward(d, dwte.data_ptr(), data_or_null(dwpe), dout.data_ptr(), ids);
    return;
  }
#if FSDP_WITH_CUDA
  Tensor workspace = ctx.empty(
      Shape{int64_t(kernels::cuda::embedding_backward_workspace_bytes(d))}, DType::u8);
  kernels::cuda::embedding_backward(d, dwte.data_ptr(), data_or_null(dwpe), dout.data_ptr(), ids,
                                    workspace.data_ptr(), ctx.stream().cuda_stream());
#endif
}

}  // namespace fsdp::ops
