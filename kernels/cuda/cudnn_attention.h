// cuDNN fused scaled-dot-product attention (flash attention) through cuDNN's backend graph
// API, for one CUDA context: the handle, and one bf16 forward and one backward execution plan
// per problem shape and stride pattern, with their workspaces. A Context extension:
// ctx.extension<kernels::cuda::CudnnAttention>().
#pragma once

#include <initializer_list>
#include <memory>
#include <string>

#include "kernels/nn_shapes.h"
#include "runtime/core/context.h"

namespace fsdp::kernels::cuda {

class CudnnAttention {
 public:
  explicit CudnnAttention(Context& ctx);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Whether cuDNN can run this problem: bf16, a supported head dimension, aligned strides,
  // and a cuDNN library that builds a plan for it (tried once per shape, then remembered).
  bool supports(const AttentionDims& d, DType dtype, bool backward);
  // Why the last unsupported problem was refused (for logs and tests).
  const std::string& last_refusal() const;
  // Whether every pointer is 16-byte aligned, as the fused kernels need.
  static bool aligned(std::initializer_list<const void*> pointers);

  // Same contract as kernels/cuda/attention.h attention_forward / attention_backward.
  void forward(const AttentionDims& d, void* out, float* lse, const void* q, const void* k,
               const void* v);
  void backward(const AttentionDims& d, void* dq, void* dk, void* dv, const void* dout,
                const void* out, const float* lse, const void* q, const void* k, const void* v);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::kernels::cuda
