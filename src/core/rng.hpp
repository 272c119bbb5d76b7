#pragma once
// A counter-based random generator: the i-th number of a stream is a pure function of (key, i),
// so values do not depend on thread count, on the order of calls, or on how the model is cut
// into pipeline stages. A stream's key is hash(seed, name), e.g. the parameter's name.
#include <cmath>
#include <cstdint>
#include <string_view>

namespace pf {

// splitmix64's finaliser: a bijective mix with good avalanche.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a over the name, then mixed with the seed.
inline uint64_t stream_key(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return mix64(h ^ mix64(seed));
}
inline uint64_t stream_key(uint64_t key, uint64_t a) { return mix64(key ^ mix64(a + 0x632be59bd9b4e019ull)); }

struct CounterRng {
  uint64_t key = 0;
  uint64_t bits(uint64_t i) const { return mix64(key ^ mix64(i)); }
  // Uniform in (0, 1): 24 random bits, never 0 (safe for log).
  float uniform(uint64_t i) const { return (static_cast<float>(bits(i) >> 40) + 0.5f) * (1.0f / 16777216.0f); }
  // Standard normal by Box-Muller on the counters 2i and 2i+1 (computed in double).
  float normal(uint64_t i) const {
    double u1 = (static_cast<double>(bits(2 * i) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = static_cast<double>(bits(2 * i + 1) >> 11) * (1.0 / 9007199254740992.0);
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
};

}  // namespace pf
