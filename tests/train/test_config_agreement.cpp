// Issue 20 item 8: the text ranks compare at start-up, and the key a difference is named by.
// (The ranks' exchange under real mpirun with MPMD launches: tests/faults/test_run_limits.cpp.)
#include "train/config_agreement.hpp"

#include <gtest/gtest.h>

namespace pf {
namespace {

KeyDifference differ(const std::vector<std::string>& sets_a, const std::vector<std::string>& sets_b,
                     const TrainRunArgs& args_a = {}, const TrainRunArgs& args_b = {}) {
  return first_difference(canonical_run_text(Config::from_toml_string("", sets_a), args_a),
                          canonical_run_text(Config::from_toml_string("", sets_b), args_b));
}

TEST(ConfigAgreement, NamesTheFirstDifferingKeyWithBothValues) {
  EXPECT_TRUE(differ({"optim.lr=1e-3"}, {"optim.lr=1e-3"}).key.empty());
  const KeyDifference lr = differ({"optim.lr=1e-3"}, {"optim.lr=2e-3"});
  EXPECT_EQ(lr.key, "optim.lr");
  EXPECT_EQ(lr.a, "0.001");
  EXPECT_EQ(lr.b, "0.002");
  EXPECT_EQ(differ({"data.seed=1"}, {"data.seed=2"}).key, "data.seed");
  EXPECT_EQ(differ({"train.steps=3"}, {"train.steps=4"}).key, "train.steps");
  // Keys in the order config.toml prints them: the model table's before optim's.
  EXPECT_EQ(differ({"model.hidden=64", "optim.lr=1"}, {"model.hidden=32", "optim.lr=2"}).key, "model.hidden");
  const KeyDifference part = differ({"parallel.stages=2", "parallel.partition=[1, 3]"}, {"parallel.stages=2", "parallel.partition=[2, 2]"});
  EXPECT_EQ(part.key, "parallel.partition");
  EXPECT_NE(part.a, part.b);
}

TEST(ConfigAgreement, FlagsThatChangeTheRunAreComparedToo) {
  TrainRunArgs a, b;
  b.init = "w.safetensors";
  const KeyDifference d = differ({}, {}, a, b);
  EXPECT_EQ(d.key, "--init");
  EXPECT_EQ(d.b, "'w.safetensors'");
  b = {};
  b.resume = "ck";
  EXPECT_EQ(differ({}, {}, a, b).key, "--resume");
}

TEST(ConfigAgreement, KeysOnlyOneSideHasAreDifferencesToo) {
  const KeyDifference d = first_difference("[t]\nx = 1\n", "[t]\nx = 1\ny = 2\n");
  EXPECT_EQ(d.key, "t.y");
  EXPECT_EQ(d.a, "(absent)");
  EXPECT_EQ(d.b, "2");
}

}  // namespace
}  // namespace pf
