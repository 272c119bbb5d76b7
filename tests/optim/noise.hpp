#pragma once
// Deterministic test values for the optimizer tests: noise(seed, i) in [-1, 1), a hash of both.
#include <cstdint>

namespace pf::test {

inline double noise(uint64_t seed, uint64_t i) {
  uint64_t x = (seed * 0x9E3779B97F4A7C15ull) ^ (i + 1) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return static_cast<double>(x >> 11) / static_cast<double>(1ull << 52) - 1.0;
}

}  // namespace pf::test
