#pragma once
// The upper triangle of a symmetric matrix (a K-FAC factor or its inverse), packed row by row:
// what travels when factors are summed or inverses broadcast (half the floats of the matrix).
// The one definition of that packing: comm's SymmetricAllReduce, dkfac's fused factor sums, the
// runtime's inverse broadcasts and the planner's broadcast cost all use it.
//
// Worked example: the 3 x 3 diagonal block at rows/columns [1, 4) of a row-major 5 x 5 matrix m
// packs as [m11 m12 m13 m22 m23 m33] (triangle_size(3) = 6 floats). Unpacking writes those six
// entries back, and with `mirror` also m21 m31 m32 (the lower triangle).
#include <algorithm>
#include <cstdint>

namespace pf {

// Floats in the upper triangle (diagonal included) of an n x n matrix.
constexpr int64_t triangle_size(int64_t n) { return n * (n + 1) / 2; }

// Packs the upper triangle of the diagonal block [first, first + size) of the row-major d x d
// matrix m into out; returns the end of what it wrote.
inline float* pack_triangle(const float* m, int64_t d, int64_t first, int64_t size, float* out) {
  for (int64_t r = first; r < first + size; ++r) out = std::copy(m + r * d + r, m + r * d + first + size, out);
  return out;
}

// The inverse of pack_triangle: writes the block's upper triangle (and, with mirror, its lower
// one) from in; returns the end of what it read. Entries outside the block are left alone.
inline const float* unpack_triangle(const float* in, float* m, int64_t d, int64_t first, int64_t size, bool mirror) {
  for (int64_t r = first; r < first + size; ++r)
    for (int64_t c = r; c < first + size; ++c, ++in) {
      m[r * d + c] = *in;
      if (mirror) m[c * d + r] = *in;
    }
  return in;
}

}  // namespace pf
