// A simple sampler: greedy or top-k with temperature, from a seeded host generator.
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
  uint64_t seed = 1;
};

// Appends options.n_tokens tokens to `prompt` (ids in [0, vocab_size), at least one) and
// returns them (the prompt not included). Each step runs the model without recording on the
// last seq_len tokens (no key/value cache: this is for short demo samples) and samples the
// next token among the real vocabulary (padded columns excluded). Deterministic for a seed.
std::vector<int32_t> generate(Context& ctx, LanguageModel& model,
                              const std::vector<int32_t>& prompt, const SampleOptions& options);

// The choice generate() makes from one row of logits (exposed for tests): `logits` holds
// vocab_size values; `uniform` is a draw in [0, 1).
int32_t sample_token(const std::vector<double>& logits, double temperature, int64_t top_k,
                     double uniform);

}  // namespace fsdp::models
