// KVCache: the keys and values of every attention layer for the tokens a model has read so
// far, so that generating a token costs one token's forward instead of the whole context's.
#pragma once

#include <cstdint>
#include <vector>

#include "models/config.h"
#include "runtime/core/context.h"
#include "runtime/nn/layers.h"

namespace fsdp::models {

struct KVCache {
  std::vector<nn::AttentionCache> layers;  // one per block, (B, capacity, Hkv, D) each
  int64_t length = 0;                      // positions filled, the same in every layer
  int64_t capacity = 0;                    // positions it can hold

  // Room for `capacity` positions of `batch` sequences of a model of config `c` (resolved),
  // in `dtype` (the model's weights' dtype), on ctx's device; empty (length 0).
  KVCache(Context& ctx, const ModelConfig& c, int64_t batch, int64_t capacity, DType dtype);
};

}  // namespace fsdp::models
