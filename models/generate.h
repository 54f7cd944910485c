// A sampler: greedy, or temperature with top-k and top-p (nucleus) filtering, from a seeded
// host generator; with or without a key/value cache.
#pragma once

#include <cstdint>
#include <vector>

#include "models/language_model.h"
#include "runtime/core/context.h"

namespace fsdp::models {

struct SampleOptions {
  int64_t n_tokens = 64;     // tokens to append
  double temperature = 1.0;  // <= 0: greedy
  int64_t top_k = 0;         // sample among the k most likely (0: all; 1: greedy)
  double top_p = 1.0;        // then among the fewest most likely whose probability reaches p
  uint64_t seed = 1;
  // Decode one token at a time over a key/value cache (LanguageModel::decode) instead of
  // running the whole window for every token. The same tokens while the sequence fits
  // seq_len; past it, the cached path restarts from the last seq_len / 2 tokens where the
  // other slides its window by one.
  bool kv_cache = false;
};

// Appends options.n_tokens tokens to `prompt` (ids in [0, vocab_size), at least one) and
// returns them (the prompt not included). Without the cache each step runs the model without
// recording on the last seq_len tokens; with it, the prompt once and then each new token.
// The next token is drawn among the real vocabulary (padded columns excluded).
// Deterministic for a seed. The model must be materialized whole (not sharded).
std::vector<int32_t> generate(Context& ctx, LanguageModel& model,
                              const std::vector<int32_t>& prompt, const SampleOptions& options);

// The choice generate() makes from one row of logits (exposed for tests): `logits` holds
// vocab_size values; `uniform` is a draw in [0, 1). Greedy (the lowest id among equal
// maxima) when temperature <= 0 or top_k == 1.
int32_t sample_token(const std::vector<double>& logits, double temperature, int64_t top_k,
                     double uniform, double top_p = 1.0);

}  // namespace fsdp::models
