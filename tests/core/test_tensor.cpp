#include "core/tensor.hpp"

#include <gtest/gtest.h>

#include <cstdint>

using pf::Tensor;

TEST(Tensor, ZeroFilledAlignedAndShaped) {
  Tensor t({2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.dim(-1), 4);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  for (float v : t) EXPECT_EQ(v, 0.0f);
}

TEST(Tensor, CopyIsDeepAndReshapeChecksCount) {
  Tensor a({2, 2});
  a.fill(3.0f);
  Tensor b = a;
  b[0] = 1.0f;
  EXPECT_EQ(a[0], 3.0f);
  EXPECT_THROW(a.reshape({3}), std::logic_error);
  a.reshape({4});
  EXPECT_EQ(a.rank(), 1);
}

TEST(Tensor, ShrinksWithinCapacityOnly) {
  Tensor t({8, 4});
  t.set_shape_within_capacity({2, 4});
  EXPECT_EQ(t.numel(), 8);
  EXPECT_THROW(t.set_shape_within_capacity({9, 4}), std::logic_error);
}
