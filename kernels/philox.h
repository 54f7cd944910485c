// The counter-based random generator behind init_normal / init_uniform: Philox4x32-10
// (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
//
// Element i of the parameter (seed, key) is a pure function of (seed, key, i): the 64-bit
// seed is Philox's key, and the counter holds the element index and the parameter's key.
// Any slice of a parameter therefore initializes alone to exactly the values it has in a
// full initialization, whatever the sharding.
#pragma once

#include <math.h>
#include <stdint.h>

#include "kernels/host_device.h"

namespace fsdp::kernels {

struct Philox4 {
  uint32_t v[4];
};

FSDP_HD Philox4 philox4x32_10(Philox4 ctr, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * ctr.v[0];
    const uint64_t p1 = uint64_t(0xCD9E8D57u) * ctr.v[2];
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    ctr = Philox4{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return ctr;
}

// Four random words for counter value `index` of the stream (seed, key).
FSDP_HD Philox4 philox_words(uint64_t seed, uint64_t key, uint64_t index) {
  const Philox4 ctr{{uint32_t(index), uint32_t(index >> 32), uint32_t(key), uint32_t(key >> 32)}};
  return philox4x32_10(ctr, uint32_t(seed), uint32_t(seed >> 32));
}

// A double in [0, 1) with 53 random bits from two words.
FSDP_HD double unit_double(uint32_t hi, uint32_t lo) {
  const uint64_t bits = ((uint64_t(hi) << 32) | lo) >> 11;
  return double(bits) * (1.0 / 9007199254740992.0);  // 2^-53
}

// Element i of a uniform [low, high) stream.
FSDP_HD double random_uniform(uint64_t seed, uint64_t key, uint64_t i, double low, double high) {
  const Philox4 r = philox_words(seed, key, i);
  return low + (high - low) * unit_double(r.v[0], r.v[1]);
}

// Element i of a normal(mean, std) stream: elements 2j and 2j+1 are the two outputs of one
// Box-Muller transform of counter j (so a pair costs one Philox call), each still a
// function of its own index alone.
FSDP_HD double random_normal(uint64_t seed, uint64_t key, uint64_t i, double mean, double std) {
  // The top bit of the index word separates this stream from the uniform one.
  const Philox4 r = philox_words(seed, key, (i >> 1) | (uint64_t(1) << 63));
  const double u1 = 1.0 - unit_double(r.v[0], r.v[1]);  // (0, 1]: log is finite
  const double u2 = unit_double(r.v[2], r.v[3]);
  const double radius = sqrt(-2.0 * log(u1));
  const double angle = 6.283185307179586 * u2;
  return mean + std * radius * ((i & 1) ? sin(angle) : cos(angle));
}

}  // namespace fsdp::kernels
