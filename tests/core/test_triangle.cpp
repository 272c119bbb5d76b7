// The one packing of a symmetric matrix's upper triangle (core/triangle.hpp).
#include "core/triangle.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace pf {
namespace {

TEST(Triangle, PacksTheWorkedExampleRowByRow) {
  // The header's example: block [1, 4) of a 5 x 5 matrix whose entry (r, c) is 10 r + c.
  std::vector<float> m(25);
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 5; ++c) m[r * 5 + c] = static_cast<float>(10 * r + c);
  std::vector<float> out(triangle_size(3));
  EXPECT_EQ(pack_triangle(m.data(), 5, 1, 3, out.data()), out.data() + 6);
  EXPECT_EQ(out, (std::vector<float>{11, 12, 13, 22, 23, 33}));
}

TEST(Triangle, UnpackInvertsPackAndMirrorsOnlyWhenAsked) {
  // A symmetric 6 x 6 matrix split into blocks [0, 2) and [2, 6), as a split factor's blocks
  // travel: packed one after the other, unpacked into a matrix of sentinels.
  const int64_t d = 6;
  std::vector<float> sym(d * d);
  for (int64_t r = 0; r < d; ++r)
    for (int64_t c = 0; c < d; ++c) sym[r * d + c] = static_cast<float>(1 + r * c + r + c);
  std::vector<float> buf(triangle_size(2) + triangle_size(4));
  float* end = pack_triangle(sym.data(), d, 0, 2, buf.data());
  EXPECT_EQ(pack_triangle(sym.data(), d, 2, 4, end), buf.data() + buf.size());
  for (bool mirror : {false, true}) {
    std::vector<float> m(d * d, -1.0f);
    const float* in = unpack_triangle(buf.data(), m.data(), d, 0, 2, mirror);
    EXPECT_EQ(unpack_triangle(in, m.data(), d, 2, 4, mirror), buf.data() + buf.size());
    for (int64_t r = 0; r < d; ++r)
      for (int64_t c = 0; c < d; ++c) {
        const bool in_block = (r < 2) == (c < 2);
        const bool written = in_block && (c >= r || mirror);
        EXPECT_EQ(m[r * d + c], written ? sym[r * d + c] : -1.0f) << r << "," << c << " mirror " << mirror;
      }
  }
}

TEST(Triangle, SizeIsHalfTheMatrixPlusTheDiagonal) {
  EXPECT_EQ(triangle_size(0), 0);
  EXPECT_EQ(triangle_size(1), 1);
  EXPECT_EQ(triangle_size(4096), 4096 * 4097 / 2);
}

}  // namespace
}  // namespace pf
