// CUDA kernels: the fused AdamW step (the twins of kernels/cpu/adamw.h).
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

// ---- fused AdamW (param f32; grad bf16/f32; moments f32/bf16; optional copy bf16/f32)
void adamw_step(const AdamWBuffers& buf, int64_t n, const AdamWScalars& s, stream_t stream);

}  // namespace fsdp::kernels::cuda
