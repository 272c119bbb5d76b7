// zb-auto and zb-v (schedule/zb_auto.hpp): sound for every size, placed as named, memory limit
// refusals.
#include "schedule/generators.hpp"
#include "schedule/validate.hpp"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <limits>

namespace pf {
namespace {

TEST(ZbAuto, ValidForEverySizeAndMemory) {
  // N < D too: the heuristic holds what it has.
  for (int D = 1; D <= 8; ++D)
    for (int N : {1, std::max(1, D - 1), D, D + 1, 2 * D, 3 * D + 1})
      for (double X : {1.0, 1.5, 2.0}) {
        SCOPED_TRACE(fmt::format("D={} N={} X={}", D, N, X));
        const Schedule s = make_zb_auto(D, N, {.forward = 1, .input_grad = 1.5, .weight_grad = 0.5, .memory = X});
        EXPECT_EQ(s.name, "zb-auto");
        EXPECT_EQ(s.stages, D);
        EXPECT_NO_THROW(validate(s));
      }
}

TEST(ZbV, ValidForEverySizeAndPlacedInAV) {
  for (int D = 1; D <= 8; ++D)
    for (int N : {1, std::max(1, D - 1), D, D + 1, 2 * D, 3 * D + 1}) {
      SCOPED_TRACE(fmt::format("D={} N={}", D, N));
      const Schedule s = make_zb_v(D, N, {.forward = 0.5, .input_grad = 0.5, .weight_grad = 0.5, .comm = 0.1});
      EXPECT_EQ(s.name, "zb-v");
      EXPECT_EQ(s.stages, 2 * D);
      EXPECT_NO_THROW(validate(s));
      // Device 0 holds the first and the last stage; stage s and 2D-1-s share a device.
      for (int st = 0; st < D; ++st) {
        EXPECT_EQ(s.device_of(0, st), st);
        EXPECT_EQ(s.device_of(0, 2 * D - 1 - st), st);
      }
    }
}

TEST(ZbAuto, OrderFollowsTheTimes) {
  // A longer W than the rest leaves no wait to fill: the heuristic's order is not H1's fixed one
  // for every time, and it is reached from the name as from the maker.
  const ZbSpec slow_w{.forward = 1, .input_grad = 1, .weight_grad = 3};
  const ZbSpec fast_w{.forward = 1, .input_grad = 1, .weight_grad = 0.25};
  EXPECT_NE(make_zb_auto(4, 8, slow_w).per_device, make_zb_auto(4, 8, fast_w).per_device);
  EXPECT_EQ(make_schedule("zb-auto", 4, 8, 2, 1, 2, slow_w).per_device, make_zb_auto(4, 8, slow_w).per_device);
  // Without T_comm only the times' ratios matter.
  const ZbSpec doubled{.forward = 2, .input_grad = 2, .weight_grad = 6};
  EXPECT_EQ(make_zb_auto(4, 8, doubled).per_device, make_zb_auto(4, 8, slow_w).per_device);
}

TEST(ZbAuto, MemoryLimitRefusedNamingTheFlag) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (double X : {nan, inf, 0.0, -1.0, 1000.0, 0.1}) {
    SCOPED_TRACE(X);
    try {
      make_zb_auto(4, 8, {.memory = X});
      FAIL();
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("--zb-memory: ", 0), 0u) << e.what();
    }
  }
  // A quarter of 1F1B's peak on 4 devices is one micro-batch: allowed.
  EXPECT_NO_THROW(validate(make_zb_auto(4, 8, {.memory = 0.25})));
}

}  // namespace
}  // namespace pf
