// CUDA kernels of the transformer ops (twins of the CPU reference in kernels/cpu/). Raw
// pointers, sizes and a stream; nothing here synchronizes with the host. Compute dtypes are
// bf16 and f32, computed and accumulated in f32; statistics (mean, rstd, lse, losses) are
// f32. Scratch memory is passed in by the caller (sizes from the *_workspace_bytes helpers),
// so every launch is asynchronous and allocation-free.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/basic.h"
#include "kernels/nn_shapes.h"
#include "kernels/scalar_math.h"

namespace fsdp::kernels::cuda {

// ---- column sums: dbias (n) (+)= sum over the m rows of dout (m, n). Deterministic: fixed
// row blocks write partial sums, then one pass adds the partials in block order.
size_t column_sum_workspace_bytes(int64_t m, int64_t n);
void bias_backward(void* dbias, DType grad_dtype, const void* dout, DType dtype, int64_t m,
                   int64_t n, bool accumulate, void* workspace, stream_t stream);

// ---- norms: one warp per row; dweight/dbias partial sums per block, reduced in fixed order.
size_t norm_workspace_bytes(const NormDims& d);
// With residual and sum: sum = x + residual is stored and normalized (a fused residual add).
// dx = dx_addend + the norm's gradient; dx_addend null (overwrite), dx (accumulate) or another
// tensor of x's dtype.
void layernorm_forward(const NormDims& d, void* out, float* mean, float* rstd, const void* x,
                       const void* residual, void* sum, const void* weight, const void* bias,
                       double eps, stream_t stream);
void layernorm_backward(const NormDims& d, void* dx, const void* dx_addend, void* dweight,
                        void* dbias, const void* dout, const void* x, const void* weight,
                        const float* mean, const float* rstd, bool accumulate, void* workspace,
                        stream_t stream);
void rmsnorm_forward(const NormDims& d, void* out, float* rstd, const void* x,
                     const void* residual, void* sum, const void* weight, double eps,
                     stream_t stream);
void rmsnorm_backward(const NormDims& d, void* dx, const void* dx_addend, void* dweight,
                      const void* dout, const void* x, const void* weight, const float* rstd,
                      bool accumulate, void* workspace, stream_t stream);

// ---- activations (contiguous)
void gelu_forward(void* out, const void* x, int64_t n, DType dtype, stream_t stream);
void gelu_backward(void* dx, const void* dout, const void* x, int64_t n, DType dtype,
                   stream_t stream);
void swiglu_forward(void* out, const void* x, int64_t rows, int64_t features, DType dtype,
                    stream_t stream);
void swiglu_backward(void* dx, const void* dout, const void* x, int64_t rows, int64_t features,
                     DType dtype, stream_t stream);

// ---- rotary embeddings, in place on a strided (B, T, H, D) tensor
void rope_apply(void* x, DType dtype, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                const HeadStrides& strides, double theta, bool inverse, int64_t position_offset,
                stream_t stream);

// ---- embeddings. Token ids must lie in [0, vocab) (not checked on the device).
void embedding_forward(const EmbeddingDims& d, void* out, const int32_t* idx, const void* wte,
                       const void* wpe, stream_t stream);
// Deterministic scatter-add: the positions of each token id are gathered into a bucket,
// sorted, and summed in position order by one block per id (no float atomics).
size_t embedding_backward_workspace_bytes(const EmbeddingDims& d);
void embedding_backward(const EmbeddingDims& d, void* dwte, void* dwpe, const void* dout,
                        const int32_t* idx, void* workspace, stream_t stream);

// ---- fused cross-entropy: one block per row. losses and lse (rows) are f32.
void cross_entropy_forward(const CrossEntropyDims& d, float* losses, float* lse,
                           const void* logits, const int32_t* targets, stream_t stream);
void cross_entropy_backward(const CrossEntropyDims& d, void* dlogits, const void* logits,
                            const float* lse, const int32_t* targets, double dloss,
                            stream_t stream);
// Both in one launch, in place: losses (rows) f32, and with write_grad the logits replaced
// by (softmax - onehot) * dloss (the chunked classifier).
void cross_entropy_forward_backward(const CrossEntropyDims& d, float* losses, void* logits,
                                    const int32_t* targets, double dloss, bool write_grad,
                                    stream_t stream);

// ---- fused AdamW (param f32; grad bf16/f32; moments f32/bf16; optional copy bf16/f32)
void adamw_step(const AdamWBuffers& buf, int64_t n, const AdamWScalars& s, stream_t stream);

// ---- counter-based initialization of n contiguous elements (any floating dtype)
void init_normal(void* out, DType dtype, int64_t n, uint64_t seed, uint64_t key, int64_t offset,
                 double mean, double std, stream_t stream);
void init_uniform(void* out, DType dtype, int64_t n, uint64_t seed, uint64_t key, int64_t offset,
                  double low, double high, stream_t stream);

// ---- our own causal GQA attention (any head_dim, any strides, bf16 or f32), used where
// cuDNN's fused attention cannot run. lse (B, H, T) f32.
void attention_forward(const AttentionDims& d, void* out, float* lse, const void* q, const void* k,
                       const void* v, DType dtype, stream_t stream);
size_t attention_backward_workspace_bytes(const AttentionDims& d);
void attention_backward(const AttentionDims& d, void* dq, void* dk, void* dv, const void* dout,
                        const void* out, const float* lse, const void* q, const void* k,
                        const void* v, DType dtype, void* workspace, stream_t stream);

}  // namespace fsdp::kernels::cuda
