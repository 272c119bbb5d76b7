#pragma once
// How parallel loops are cut. Loops hand out pieces on demand (OpenMP's dynamic schedule) instead
// of giving each thread a fixed share: on a shared machine a descheduled thread then delays only
// the piece it holds while the others take the rest (with a static split every barrier waits for
// it: 2 threads ran 4x slower than 1 beside a busy process). Which elements a piece computes does
// not depend on the thread that runs it, so results keep their bits.
//
//   #pragma omp parallel for schedule(dynamic, kPieceElements)        // over elements
//   #pragma omp parallel for schedule(dynamic, rows_per_piece(cols))  // over rows of `cols`
//   #pragma omp parallel for schedule(dynamic, 1)                     // over blocks, heads, chunks
#include <algorithm>
#include <cstdint>

namespace pf {

// ~64 KB of floats: a few microseconds of elementwise work, so taking a piece (one atomic add)
// costs a few percent of it.
constexpr int64_t kPieceElements = 1 << 14;

// Rows per piece of a loop over rows of `cols` elements.
inline int64_t rows_per_piece(int64_t cols) { return std::max<int64_t>(1, kPieceElements / std::max<int64_t>(1, cols)); }

}  // namespace pf
