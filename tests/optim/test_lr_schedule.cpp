#include "optim/lr_schedule.hpp"

#include "config/config.hpp"
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

// optim.schedule against its closed form, step by step, with a floor: 10 warm-up steps, then 40
// decay steps from 1e-3 to 1e-4 (p = (s - 10) / 40).
TEST(LrSchedule, EveryDecayMatchesItsClosedForm) {
  const double lr = 1e-3, floor = 1e-4, pi = 3.14159265358979323846;
  const struct {
    LrDecay decay;
    double (*f)(double p);
  } cases[] = {
      {LrDecay::Poly, [](double p) { return std::sqrt(1 - p); }},
      {LrDecay::Linear, [](double p) { return 1 - p; }},
      {LrDecay::Cosine, [](double p) { return (1 + std::cos(3.14159265358979323846 * p)) / 2; }},
      {LrDecay::Constant, [](double) { return 1.0; }},
  };
  for (const auto& c : cases) {
    OptimConfig o;
    o.lr = lr, o.warmup_steps = 10, o.schedule = c.decay, o.min_lr = floor;
    const LrSchedule s = make_lr_schedule(o, 50);
    for (int64_t i = 0; i < 10; ++i) EXPECT_DOUBLE_EQ(s.at(i), lr * (i + 1) / 10.0) << i;  // the same warm-up
    for (int64_t i = 10; i < 50; ++i)
      EXPECT_NEAR(s.at(i), floor + (lr - floor) * c.f((i - 10) / 40.0), 1e-15) << static_cast<int>(c.decay) << " " << i;
    EXPECT_DOUBLE_EQ(s.at(50), c.decay == LrDecay::Constant ? lr : floor);  // past the decay: the floor
  }
  // Cosine's midpoint is half-way between peak and floor; it ends a step short of the floor.
  OptimConfig o;
  o.lr = lr, o.warmup_steps = 10, o.schedule = LrDecay::Cosine, o.min_lr = floor;
  const LrSchedule s = make_lr_schedule(o, 50);
  EXPECT_NEAR(s.at(30), (lr + floor) / 2, 1e-15);
  EXPECT_GT(s.at(49), floor);
  EXPECT_NEAR(s.at(49), floor + (lr - floor) * (1 + std::cos(pi * 39 / 40)) / 2, 1e-15);
}

TEST(LrSchedule, FloorAboveThePeakIsRefused) {
  EXPECT_NO_THROW(Config::from_toml_string("", {"optim.schedule=cosine", "optim.lr=1e-3", "optim.min_lr=1e-3"}));
  try {
    Config::from_toml_string("", {"optim.lr=1e-3", "optim.min_lr=2e-3"});
    ADD_FAILURE() << "accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("optim.min_lr: must be at most optim.lr"), std::string::npos) << e.what();
  }
  try {
    Config::from_toml_string("", {"optim.schedule=cosin"});
    ADD_FAILURE() << "accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("optim.schedule"), std::string::npos) << e.what();
  }
}
