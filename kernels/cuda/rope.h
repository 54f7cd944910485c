// CUDA kernels: rotary position embeddings (the twins of kernels/cpu/rope.h; RopeDims in
// kernels/nn_shapes.h). Raw pointers, sizes and a stream; nothing here synchronizes with the
// host. bf16 or f32, computed in f32.
#pragma once

#include <cstddef>

#include "kernels/cuda/basic.h"
#include "kernels/nn_shapes.h"

namespace fsdp::kernels::cuda {

// The scratch rope() needs: the cosines and sines of the rows' angles, (seq, D/2) each.
size_t rope_workspace_bytes(const RopeDims& d);
// out = x rotated by position, in place when out is x. workspace: rope_workspace_bytes(d),
// 16-byte aligned.
void rope(const RopeDims& d, void* out, const void* x, DType dtype, void* workspace,
          stream_t stream);

}  // namespace fsdp::kernels::cuda
