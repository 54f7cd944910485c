// Seeded shuffling that gives the same order on every machine, compiler and standard library
// (std::shuffle and std::uniform_int_distribution do not promise that), so every rank and
// every resumed run agree on the sample order.
#pragma once

#include <cstdint>
#include <vector>

namespace fsdp::data {

// SplitMix64: a small, fast generator with a 64-bit state; plenty for shuffling.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next();
  uint64_t below(uint64_t bound);  // uniform in [0, bound), bound > 0, without modulo bias

 private:
  uint64_t state_;
};

// What a permutation is for, so that the streams drawn from one seed are independent.
enum class ShuffleStream : uint64_t { documents = 1, samples = 2 };

// A permutation of [0, n) determined by (seed, stream, epoch) alone (Fisher-Yates).
std::vector<uint64_t> seeded_permutation(uint64_t n, uint64_t seed, ShuffleStream stream,
                                         uint64_t epoch);

}  // namespace fsdp::data
