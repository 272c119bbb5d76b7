#include "optim/lr_schedule.hpp"

#include "core/error.hpp"

#include <gtest/gtest.h>

#include <cmath>

using namespace pf;

TEST(LrSchedule, WarmUpThenSquareRootDecayExactValues) {
  OptimConfig c;
  c.lr = 1e-3;
  c.warmup_steps = 10;
  LrSchedule s = make_lr_schedule(c, 110);  // 100 decay steps
  EXPECT_DOUBLE_EQ(s.at(0), 1e-4);          // first step: lr / W
  EXPECT_DOUBLE_EQ(s.at(4), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(9), 1e-3);          // last warm-up step reaches the peak
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);         // first decay step: progress 0
  EXPECT_DOUBLE_EQ(s.at(60), 1e-3 * std::sqrt(0.5));  // half-way through the decay
  EXPECT_DOUBLE_EQ(s.at(85), 1e-3 * 0.5);             // progress 3/4 -> sqrt(1/4)
  EXPECT_DOUBLE_EQ(s.at(109), 1e-4);        // last step: lr * sqrt(1/100)
  EXPECT_EQ(s.at(110), 0.0);                // past the run
  for (int64_t i = 10; i < 109; ++i) EXPECT_GT(s.at(i), s.at(i + 1));
}

TEST(LrSchedule, PowerAndNoWarmUp) {
  OptimConfig c;
  c.lr = 2.0;
  c.warmup_steps = 0;
  c.decay_power = 1.0;  // linear decay
  LrSchedule s = make_lr_schedule(c, 4);
  EXPECT_DOUBLE_EQ(s.at(0), 2.0);
  EXPECT_DOUBLE_EQ(s.at(1), 1.5);
  EXPECT_DOUBLE_EQ(s.at(3), 0.5);
  EXPECT_EQ(s.at(4), 0.0);
}

TEST(LrSchedule, BadLengthsAreUsageErrors) {
  OptimConfig c;
  c.warmup_steps = -1;
  EXPECT_THROW(make_lr_schedule(c, 10), UsageError);
  c.warmup_steps = 0;
  EXPECT_THROW(make_lr_schedule(c, 0), UsageError);
}
