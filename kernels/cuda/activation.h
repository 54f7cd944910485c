// CUDA kernels: GELU and SwiGLU (the twins of kernels/cpu/activation.h).
// Raw pointers, sizes and a stream; nothing here synchronizes with the host. Compute dtypes
// are bf16 and f32, computed and accumulated in f32; statistics (mean, rstd, lse, losses) are
// f32. Scratch memory is passed in by the caller (sizes from the *_workspace_bytes helpers),
// so every launch is asynchronous and allocation-free.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/basic.h"
#include "kernels/nn_shapes.h"
#include "kernels/scalar_math.h"

namespace fsdp::kernels::cuda {

// ---- activations (contiguous)
void gelu_forward(void* out, const void* x, int64_t n, DType dtype, stream_t stream);
void gelu_backward(void* dx, const void* dout, const void* x, int64_t n, DType dtype,
                   stream_t stream);
void swiglu_forward(void* out, const void* x, int64_t rows, int64_t features, DType dtype,
                    stream_t stream);
void swiglu_backward(void* dx, const void* dout, const void* x, int64_t rows, int64_t features,
                     DType dtype, stream_t stream);

}  // namespace fsdp::kernels::cuda
