// Placeholder definitions of the CUDA transformer kernels until they land: every call
// throws DeviceError, so CUDA builds link and fail loudly instead of computing nothing.
#include "kernels/cuda/blas.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/nn_kernels.h"

namespace fsdp::kernels::cuda {
namespace {
[[noreturn]] void missing(const char* what) {
  FSDP_THROW(DeviceError, what, ": no CUDA implementation in this build yet");
}
}  // namespace

size_t column_sum_workspace_bytes(int64_t, int64_t) { return 0; }
void bias_backward(void*, DType, const void*, DType, int64_t, int64_t, bool, void*, stream_t) { missing("bias_backward"); }
size_t norm_workspace_bytes(const NormDims&) { return 0; }
void layernorm_forward(const NormDims&, void*, float*, float*, const void*, const void*, const void*, double, stream_t) { missing("layernorm_forward"); }
void layernorm_backward(const NormDims&, void*, void*, void*, const void*, const void*, const void*, const float*, const float*, bool, bool, void*, stream_t) { missing("layernorm_backward"); }
void rmsnorm_forward(const NormDims&, void*, float*, const void*, const void*, double, stream_t) { missing("rmsnorm_forward"); }
void rmsnorm_backward(const NormDims&, void*, void*, const void*, const void*, const void*, const float*, bool, bool, void*, stream_t) { missing("rmsnorm_backward"); }
void gelu_forward(void*, const void*, int64_t, DType, stream_t) { missing("gelu_forward"); }
void gelu_backward(void*, const void*, const void*, int64_t, DType, stream_t) { missing("gelu_backward"); }
void swiglu_forward(void*, const void*, int64_t, int64_t, DType, stream_t) { missing("swiglu_forward"); }
void swiglu_backward(void*, const void*, const void*, int64_t, int64_t, DType, stream_t) { missing("swiglu_backward"); }
void rope_apply(void*, DType, int64_t, int64_t, int64_t, int64_t, const HeadStrides&, double, bool, stream_t) { missing("rope_apply"); }
void embedding_forward(const EmbeddingDims&, void*, const int32_t*, const void*, const void*, stream_t) { missing("embedding_forward"); }
size_t embedding_backward_workspace_bytes(const EmbeddingDims&) { return 0; }
void embedding_backward(const EmbeddingDims&, void*, void*, const void*, const int32_t*, void*, stream_t) { missing("embedding_backward"); }
void cross_entropy_forward(const CrossEntropyDims&, float*, float*, const void*, const int32_t*, stream_t) { missing("cross_entropy_forward"); }
void cross_entropy_backward(const CrossEntropyDims&, void*, const void*, const float*, const int32_t*, double, stream_t) { missing("cross_entropy_backward"); }
void adamw_step(const AdamWBuffers&, int64_t, const AdamWScalars&, stream_t) { missing("adamw_step"); }
void init_normal(void*, DType, int64_t, uint64_t, uint64_t, int64_t, double, double, stream_t) { missing("init_normal"); }
void init_uniform(void*, DType, int64_t, uint64_t, uint64_t, int64_t, double, double, stream_t) { missing("init_uniform"); }
void attention_forward(const AttentionDims&, void*, float*, const void*, const void*, const void*, DType, stream_t) { missing("attention_forward"); }
size_t attention_backward_workspace_bytes(const AttentionDims&) { return 0; }
void attention_backward(const AttentionDims&, void*, void*, void*, const void*, const void*, const float*, const void*, const void*, const void*, DType, void*, stream_t) { missing("attention_backward"); }

struct Blas::Impl {};
Blas::Blas(Context&) {}
Blas::~Blas() = default;
void Blas::matmul(const MatmulDims&, void*, DType, const void*, const void*, DType, double, double, const void*, void*, bool) { missing("matmul"); }
size_t Blas::cached_plans() const { return 0; }

struct CudnnAttention::Impl { std::string refusal = "no cuDNN attention in this build yet"; };
CudnnAttention::CudnnAttention(Context&) : impl_(new Impl) {}
CudnnAttention::~CudnnAttention() = default;
bool CudnnAttention::supports(const AttentionDims&, DType, bool) { return false; }
const std::string& CudnnAttention::last_refusal() const { return impl_->refusal; }
void CudnnAttention::forward(const AttentionDims&, void*, float*, const void*, const void*, const void*) { missing("cudnn attention"); }
void CudnnAttention::backward(const AttentionDims&, void*, void*, void*, const void*, const void*, const float*, const void*, const void*, const void*) { missing("cudnn attention"); }

}  // namespace fsdp::kernels::cuda
