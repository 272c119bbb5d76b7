// kfac.placement = adaptive (runtime/bubble_filler.hpp): the plan's units placed at run time into
// the waits each rank sees. Timing decides only when a unit runs, never what it computes: with
// the same plan (made-up timings, kfac.plan_profile) an adaptive run trains the bits of the
// static plan's (bubbles) and writes the same refresh record, under the benchmarks' noise too
// (one rank slowed, random jitter: other waits, other choices), for 1F1B, Chimera, replicas and
// zero-bubble; and it equals single-process K-FAC following its record, like bubbles.
#include "pipefisher_fixture.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

using namespace pf_test::pipefisher;

namespace {

std::string bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// bubbles and adaptive (quiet, then noisy) on one plan: the same weights and refresh record.
void expect_adaptive_equals_bubbles(const std::string& name, int ranks, const std::string& layout) {
  const std::string sets = layout + " --set kfac.replan_on_drift=false --set kfac.plan_profile=" +
                           made_up_plan_profile(name, layout, ranks).string();
  Launched b = launch(ranks, name + "_bubbles", sets + " --set kfac.placement=bubbles");
  ASSERT_EQ(b.status, 0) << b.out;
  const std::string noises[] = {"", "--bench-slow 1:3 --bench-jitter 0.2"};
  for (const std::string& noise : noises) {
    const std::string run = name + (noise.empty() ? "_adaptive" : "_adaptive_noisy");
    Launched a = launch(ranks, run, sets + " --set kfac.placement=adaptive " + noise);
    ASSERT_EQ(a.status, 0) << a.out;
    EXPECT_NE(a.out.find("pipefisher: adaptive: "), std::string::npos) << a.out;
    EXPECT_EQ(saved_weights(dir() / (run + ".safetensors")), saved_weights(dir() / (name + "_bubbles.safetensors")))
        << run;
    EXPECT_EQ(bytes(dir() / run / "kfac_refresh.json"), bytes(dir() / (name + "_bubbles") / "kfac_refresh.json")) << run;
  }
}

}  // namespace

TEST(PipeFisherAdaptive, TrainsTheStaticPlansBitsUnderNoise) {
  expect_adaptive_equals_bubbles("ad_1f1b", 2, "--set parallel.stages=2 --set parallel.schedule=1f1b");
  expect_adaptive_equals_bubbles("ad_chimera", 2,
                                 "--set parallel.stages=2 --set parallel.schedule=chimera --set train.steps=16");
  expect_adaptive_equals_bubbles("ad_zbh1", 2, "--set parallel.stages=2 --set parallel.schedule=zb-h1");
}

TEST(PipeFisherAdaptive, ReplicasTrainTheStaticPlansBitsUnderNoise) {
  expect_adaptive_equals_bubbles("ad_1f1b_2x2", 4,
                                 "--set parallel.stages=2 --set parallel.schedule=1f1b --set parallel.data_parallel=2 "
                                 "--set parallel.micro_batches=2");
}

// Planned from this run's own profile (no kfac.plan_profile), as a user runs it.
TEST(PipeFisherAdaptive, EqualsSingleProcessWithSamePattern) {
  expect_bubbles_match("ad_1f1b_ref", 2, "--set parallel.stages=2 --set parallel.schedule=1f1b --set kfac.placement=adaptive",
                       {});
}
