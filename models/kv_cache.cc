#include "models/kv_cache.h"

#include "runtime/core/error.h"

namespace fsdp::models {

KVCache::KVCache(Context& ctx, const ModelConfig& c, int64_t batch, int64_t capacity_,
                 DType dtype)
    : capacity(capacity_) {
  const ModelConfig r = c.resolved();
  FSDP_CHECK(batch > 0 && capacity > 0, ValueError, "KVCache: batch ", batch, " and capacity ",
             capacity, " must be positive");
  const int64_t kv_heads = r.family == Family::Llama ? r.n_kv_head : r.n_head;
  const Shape shape{batch, capacity, kv_heads, r.head_dim()};
  for (int64_t i = 0; i < r.n_layer; ++i)
    layers.push_back({ctx.empty(shape, dtype), ctx.empty(shape, dtype)});
}

}  // namespace fsdp::models
