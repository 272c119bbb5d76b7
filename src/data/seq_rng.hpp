#pragma once
// The data pipeline's random numbers: splitmix64 (Steele, Lea & Flood 2014), a 64-bit counter
// stepped by the golden ratio and passed through a bijective mixer. It is a few lines of integer
// arithmetic, so streams are identical on every platform and compiler. Each sequence gets its own
// stream keyed by (seed, purpose, sequence index), which is what makes masking independent of how
// sequences are cut into micro-batches, stages and replicas.
#include <cstdint>

namespace pf {

struct SeqRng {
  uint64_t state;

  static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Stream for item `index` of purpose `purpose` (a fixed tag) under `seed`.
  static SeqRng keyed(uint64_t seed, uint64_t purpose, uint64_t index) {
    return SeqRng{mix(mix(seed ^ (purpose * 0x9e3779b97f4a7c15ull)) + index)};
  }
  uint64_t next() { return mix(state += 0x9e3779b97f4a7c15ull); }
  // Uniform double in [0, 1) from the top 53 bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }
  // Uniform integer in [0, n) by the multiply-shift map (bias below n / 2^64: negligible).
  uint64_t below(uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64); }
};

}  // namespace pf
