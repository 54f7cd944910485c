// CPU fused softmax cross-entropy over padded logits rows. logits (rows, Vp) with the
// classes in [0, V) and padding in [V, Vp); targets in [0, V) or -1 (ignored row).
// losses and lse (rows) have the logits' dtype (f32 or f64). Computed in double.
#pragma once

#include <cstdint>

#include "kernels/nn_shapes.h"
#include "runtime/core/dtype.h"

namespace fsdp::kernels::cpu {

// Throws IndexError for a target outside [0, V) other than -1.
void cross_entropy_forward(const CrossEntropyDims& d, void* losses, void* lse, const void* logits,
                           const int32_t* targets);
// dlogits = (softmax - onehot) * dloss; 0 in padded columns and ignored rows. dlogits may
// be logits itself.
// A vocabulary-parallel shard (d.vocab_begin) writes its own columns of that gradient.
void cross_entropy_backward(const CrossEntropyDims& d, void* dlogits, const void* logits,
                            const void* lse, const int32_t* targets, double dloss);
// Both in one pass over each row (the chunked classifier's kernel): losses (rows) as
// cross_entropy_forward and, when write_grad, the logits overwritten in place with
// (softmax - onehot) * dloss (0 in padded columns and ignored rows). Without write_grad the
// logits are left as they are.
void cross_entropy_forward_backward(const CrossEntropyDims& d, void* losses, void* logits,
                                    const int32_t* targets, double dloss, bool write_grad);

// Vocabulary parallelism: logits (rows, Vp) hold classes [d.vocab_begin, d.vocab_begin + Vp)
// of d.vocab. partials (3, rows) in the logits' dtype: the shard's max m over its classes,
// the sum of exp(x - m) (-inf and 0 when it holds no class), and the target's logit when
// the shard holds the target (0 otherwise).
void cross_entropy_shard_stats(const CrossEntropyDims& d, void* partials, const void* logits,
                               const int32_t* targets);
// Every shard's partials (shards, 3, rows), merged in shard order: lse (rows) and losses
// (rows, 0 for ignored rows), all of `dtype`.
void cross_entropy_merge_shards(int64_t rows, int64_t shards, DType dtype, void* losses,
                                void* lse, const void* partials, const int32_t* targets);

}  // namespace fsdp::kernels::cpu
