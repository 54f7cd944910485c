// CUDA mixture-of-experts kernels (the twins of kernels/cpu/moe.h): top-k routing, the
// stable grouping of (token, slot) pairs by expert, and the row gathers to and from the
// experts. Raw pointers, sizes and a stream; nothing here synchronizes with the host. Rows
// are bf16 or f32, computed in f32; scores, weights and their gradients are f32. Expert
// indices and row maps must lie in range (not checked on the device).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/basic.h"
#include "kernels/nn_shapes.h"

namespace fsdp::kernels::cuda {

// The largest expert count the router kernels take (a row's scores sit in shared memory).
constexpr int64_t kMaxRouterExperts = 4096;

// As kernels::cpu::moe_router_forward: the scores are computed in double, like the CPU's,
// so both backends store the same f32 scores and choose the same experts.
void moe_router_forward(const RouterDims& d, int32_t* indices, float* weights, float* scores,
                        const void* logits, const float* bias, stream_t stream);
// As kernels::cpu::moe_router_backward (dscores may be null).
void moe_router_backward(const RouterDims& d, void* dlogits, const float* dweights,
                         const float* dscores, const float* scores, const int32_t* indices,
                         stream_t stream);

// As kernels::cpu::moe_group_expert_counts (counts (groups, E) i32 on the device).
void moe_group_expert_counts(const MoeLossDims& d, int32_t* counts, const int32_t* indices,
                             stream_t stream);
// As kernels::cpu::moe_balancing_loss (f32 scores): counts (groups, E) i32 holds the runs'
// choices when `counted` (run_counts), and is otherwise a workspace this counts them into.
// One warp per token, its sums in double.
void moe_balancing_loss(const MoeLossDims& d, float* per_token, float* dscores,
                        const float* scores, const int32_t* indices, int32_t* counts,
                        bool counted, double coeff, stream_t stream);
// As kernels::cpu::moe_z_loss (per_token f32). One warp per token, its sums in double.
void moe_z_loss(const MoeLossDims& d, float* per_token, void* dlogits, const void* logits,
                double coeff, stream_t stream);

// As kernels::cpu::moe_sort_by_expert, through a stable radix sort of the pairs by expert.
size_t moe_sort_workspace_bytes(int64_t tokens, int64_t top_k, int64_t experts);
void moe_sort_by_expert(int64_t tokens, int64_t top_k, int64_t experts, int32_t* counts,
                        int32_t* source, int32_t* dest, const int32_t* indices, void* workspace,
                        stream_t stream);

// The gathers of kernels/cpu/moe.h; no atomics, so every result is deterministic.
void moe_permute(const MoeRowsDims& d, void* x_sorted, const void* x, const int32_t* source,
                 stream_t stream);
void moe_permute_backward(const MoeRowsDims& d, void* dx, const void* dx_sorted,
                          const int32_t* dest, bool accumulate_dx, stream_t stream);
void moe_unpermute(const MoeRowsDims& d, void* out, const void* y_sorted, const float* weights,
                   const int32_t* dest, stream_t stream);
void moe_unpermute_backward(const MoeRowsDims& d, void* dy_sorted, float* dweights,
                            const void* dout, const void* y_sorted, const float* weights,
                            const int32_t* dest, stream_t stream);

}  // namespace fsdp::kernels::cuda
