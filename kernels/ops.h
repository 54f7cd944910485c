// The kernel dispatch layer: Tensor in, Tensor out, routed by device and dtype. Include this
// header for any of it.
//
// Every op checks its arguments (shapes, dtypes, devices, contiguity) with clear errors,
// then calls the raw-pointer kernel of the tensor's backend: kernels/cpu/ (the numerical
// reference) or kernels/cuda/ (issued on ctx.stream()). Kernels themselves never see a
// Tensor. Results of reductions stay on the device as one-element tensors, so no op
// synchronizes with the host unless its name says so (item(), to_host()).
//
// Each family has one name: its ops are declared in kernels/FAMILY.h and dispatched by
// kernels/FAMILY.cc to kernels/cpu/FAMILY.h and kernels/cuda/FAMILY.h (a family with more
// CUDA files names them in its header).
//
// Conventions of the transformer ops (shared by the CPU reference in kernels/cpu/ and the
// CUDA kernels in kernels/cuda/):
// - Activations and weights share one compute dtype: f32 or f64 on the CPU, bf16 or f32 on
//   CUDA. bf16 is computed in f32 and rounded once when stored. One exception, on CUDA: the
//   residual stream may be f32 beside bf16 weights (the embedding's output, the norms' x and
//   dx), so the sums that carry the signal through the network are never rounded to bf16.
// - Statistics saved for backward (norm mean/rstd, attention logsumexp, per-token losses)
//   are f32 (f64 when the compute dtype is f64).
// - Parameter gradients are written into tensors of their own "grad dtype" (f32 or f64 on
//   the CPU; bf16 or f32 on CUDA), which may differ from the compute dtype, and are
//   ACCUMULATED (+=) when `accumulate` is true, overwritten otherwise. Activation gradients
//   are written in the compute dtype; `accumulate_dx` adds instead of overwriting where the
//   op's input feeds more than one consumer (the residual stream).
// - Weights follow PyTorch's layout: a Linear weight is (out_features, in_features).
// - Shapes in comments: B batch, T sequence, C channels, H heads, Hkv key/value heads,
//   D head dim, V vocabulary, Vp padded vocabulary, N rows (= B*T), F hidden features.
#pragma once

#include "kernels/activation.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/basic.h"
#include "kernels/block_reduce.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/fp8.h"
#include "kernels/init.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "kernels/newton_schulz.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
