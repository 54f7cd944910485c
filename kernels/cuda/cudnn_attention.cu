// Placeholder for cuDNN's fused attention until it lands: supports() says no, so attention
// runs on our own CUDA kernels.
#include "kernels/cuda/cudnn_attention.h"

namespace fsdp::kernels::cuda {
namespace {
[[noreturn]] void missing(const char* what) {
  FSDP_THROW(DeviceError, what, ": no CUDA implementation in this build yet");
}
}  // namespace



struct CudnnAttention::Impl { std::string refusal = "no cuDNN attention in this build yet"; };
CudnnAttention::CudnnAttention(Context&) : impl_(new Impl) {}
CudnnAttention::~CudnnAttention() = default;
bool CudnnAttention::supports(const AttentionDims&, DType, bool) { return false; }
const std::string& CudnnAttention::last_refusal() const { return impl_->refusal; }
void CudnnAttention::forward(const AttentionDims&, void*, float*, const void*, const void*, const void*) { missing("cudnn attention"); }
void CudnnAttention::backward(const AttentionDims&, void*, void*, void*, const void*, const void*, const float*, const void*, const void*, const void*) { missing("cudnn attention"); }

}  // namespace fsdp::kernels::cuda
