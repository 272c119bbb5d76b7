// The hidden test flags of `pipefisher train` (train/test_seams.hpp): K-FAC's planning seams parse
// to what the runtime uses, and a malformed value is a UsageError naming its flag.
#include "train/test_seams.hpp"

#include "core/error.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace pf {
namespace {

std::string refused_flag(const std::string& drift, const std::string& scale, const std::string& bcast) {
  try {
    parse_kfac_flags(drift, scale, bcast);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(KfacSeams, FlagsGiveTheNumbersTheRuntimeUses) {
  const KfacSeams none = parse_kfac_flags("", "", "");
  EXPECT_EQ(none.drift_at_step, 0);
  EXPECT_EQ(none.cost_scale, 1);
  EXPECT_FALSE(none.bcast_model.has_value());
  for (int64_t i = 0; i < 20; ++i) EXPECT_FALSE(none.drifts(i));
  const KfacSeams k = parse_kfac_flags("5", "0.05", "0.03,0");
  EXPECT_EQ(k.cost_scale, 0.05);
  ASSERT_TRUE(k.bcast_model.has_value());
  EXPECT_EQ(k.bcast_model->first, 0.03);
  EXPECT_EQ(k.bcast_model->second, 0);
  // Steps 5, 6 and 7 as the log numbers them: indices 4, 5 and 6.
  for (int64_t i = 0; i < 20; ++i) EXPECT_EQ(k.drifts(i), i >= 4 && i <= 6) << i;
}

TEST(KfacSeams, NonsenseIsRefusedNamingTheFlag) {
  EXPECT_NE(refused_flag("0", "", "").find("--test-drift-at"), std::string::npos);
  EXPECT_NE(refused_flag("x", "", "").find("--test-drift-at"), std::string::npos);
  for (const char* bad : {"0", "-1", "inf", "nan", "2x", ""}) {
    if (std::string(bad).empty()) continue;
    EXPECT_NE(refused_flag("", bad, "").find("--test-kfac-cost-scale"), std::string::npos) << bad;
  }
  for (const char* bad : {"0.1", "a,b", "1,-1", "1,inf"})
    EXPECT_NE(refused_flag("", "", bad).find("--test-bcast-model"), std::string::npos) << bad;
}

// The noise a rank's action gets: FACTOR - 1 times its compute on the slowed rank inside the
// steps, nothing elsewhere; jitter below FRACTION times the compute, the same for the same
// (rank, step, action) and spread over [0, FRACTION) across actions.
TEST(NoiseSeam, SlowsTheChosenRankInItsStepsAndJittersRepeatably) {
  EXPECT_FALSE(parse_noise_flags("", "").on());
  const NoiseSeam slow = parse_noise_flags("1:3@2-3", "");
  ASSERT_TRUE(slow.on());
  const int64_t ms = 1000000;
  for (int64_t index = 0; index < 5; ++index) {
    EXPECT_EQ(slow.extra_ns(0, index, 0, ms), 0) << index;
    EXPECT_EQ(slow.extra_ns(1, index, 7, ms), index == 1 || index == 2 ? 2 * ms : 0) << index;
  }
  const NoiseSeam jitter = parse_noise_flags("", "0.2");
  double lo = 1, hi = 0;
  for (size_t action = 0; action < 200; ++action) {
    const int64_t x = jitter.extra_ns(1, 3, action, ms);
    EXPECT_EQ(x, jitter.extra_ns(1, 3, action, ms));
    EXPECT_GE(x, 0);
    EXPECT_LT(x, ms / 5);
    lo = std::min(lo, double(x) / ms), hi = std::max(hi, double(x) / ms);
  }
  EXPECT_LT(lo, 0.02);  // 200 uniform draws: the extremes come within a tenth of the range's ends
  EXPECT_GT(hi, 0.18);
  EXPECT_NE(jitter.extra_ns(0, 3, 5, ms), jitter.extra_ns(1, 3, 5, ms));
}

TEST(NoiseSeam, NonsenseIsRefusedNamingTheFlag) {
  for (const char* bad : {"1", "x:2", "-1:2", "1:0.5", "1:101", "1:inf", "1:2@3", "1:2@4-2", "1:2@0-3"}) {
    try {
      parse_noise_flags(bad, "");
      ADD_FAILURE() << bad;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--bench-slow"), std::string::npos) << bad << ": " << e.what();
    }
  }
  for (const char* bad : {"-0.1", "1.5", "nan", "x"}) {
    try {
      parse_noise_flags("", bad);
      ADD_FAILURE() << bad;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--bench-jitter"), std::string::npos) << bad << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace pf
