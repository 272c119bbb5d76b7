#pragma once
// Deterministic parallel loops for the optimizers. A tensor is cut into fixed chunks of kChunk
// elements; chunks run in parallel, and sums are kept per chunk (and per lane of 8 within a chunk)
// and combined in a fixed order afterwards. The result is the same bits for any thread count.
#include "core/error.hpp"
#include "core/parallel.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace pf::optim_detail {

constexpr int64_t kChunk = 1 << 14;  // a multiple of 8, so lanes line up across chunks
inline int64_t num_chunks(int64_t n) { return (n + kChunk - 1) / kChunk; }

// Accumulates x into lane (i % 8) of a lane array: independent accumulators in a fixed order.
struct Lanes {
  double v[8] = {};
  double total() const {
    double s = 0;
    for (double x : v) s += x;
    return s;
  }
};

// Calls f(i, lane) for i in [b, e), where lane = i % 8 (b must be a multiple of 8). Full groups of
// 8 are written as an inner loop of constant trip count so the compiler vectorizes them.
template <typename F>
inline void for_lanes(int64_t b, int64_t e, F&& f) {
  int64_t i = b;
  for (; i + 8 <= e; i += 8)
    for (int j = 0; j < 8; ++j) f(i + j, j);
  for (; i < e; ++i) f(i, static_cast<int>(i & 7));
}

// Calls f(begin, end) over the chunks of [0, n), in parallel. For elementwise updates.
template <typename F>
void for_chunks(int64_t n, F&& f) {
  const int64_t chunks = num_chunks(n);
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) f(c * kChunk, std::min(n, (c + 1) * kChunk));
}

// Calls f(begin, end, sums) over the chunks of [0, n), in parallel, where f fills K sums for its
// chunk; returns the chunk sums added in chunk order. `partial` holds K doubles per chunk.
template <int K, typename F>
std::array<double, K> chunked_sums(int64_t n, std::vector<double>& partial, F&& f) {
  const int64_t chunks = num_chunks(n);
  PF_CHECK(partial.size() >= static_cast<size_t>(chunks * K), "scratch of {} for {} chunks", partial.size(),
           chunks);
#pragma omp parallel for schedule(dynamic, 1) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    std::array<double, K> s{};
    f(c * kChunk, std::min(n, (c + 1) * kChunk), s);
    for (int k = 0; k < K; ++k) partial[c * K + k] = s[k];
  }
  std::array<double, K> total{};
  for (int64_t c = 0; c < chunks; ++c)
    for (int k = 0; k < K; ++k) total[k] += partial[c * K + k];
  return total;
}

}  // namespace pf::optim_detail
