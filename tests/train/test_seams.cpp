// The hidden test flags of `pipefisher train` (train/test_seams.hpp): K-FAC's planning seams parse
// to what the runtime uses, and a malformed value is a UsageError naming its flag.
#include "train/test_seams.hpp"

#include "core/error.hpp"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace pf
