#include "runtime/data/shuffle.h"

#include <numeric>
#include <utility>

#include "runtime/core/error.h"

namespace fsdp::data {
namespace {

// SplitMix64's output function, used on its own to derive well-mixed sub-seeds.
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t SplitMix64::next() {
  state_ += 0x9E3779B97F4A7C15ull;
  return mix(state_);
}

uint64_t SplitMix64::below(uint64_t bound) {
  FSDP_ASSERT(bound > 0);
  // Values below `threshold` would make some residues more likely; draw again.
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const uint64_t r = next();
    if (r >= threshold) return r % bound;
  }
}

std::vector<uint64_t> seeded_permutation(uint64_t n, uint64_t seed, ShuffleStream stream,
                                         uint64_t epoch) {
  std::vector<uint64_t> order(n);
  std::iota(order.begin(), order.end(), uint64_t{0});
  SplitMix64 rng(mix(mix(seed) ^ mix(static_cast<uint64_t>(stream) + (epoch << 8))));
  for (uint64_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  return order;
}

}  // namespace fsdp::data
