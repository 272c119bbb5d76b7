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
#include <map>
#include <string>
#include <tuple>

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

// The pictures show which waits the filler filled: every unit it ran inside a receive's wait
// carries that receive in the trace (args.in_wait_of) and a bar in the SVG's lane, and the
// trace's marks are exactly the units the run counted as run in waits (its summary line).
// Timing decides how many (none, on a machine too loaded for any unit to fit), not the match.
TEST(PipeFisherAdaptive, TraceMarksTheWaitsItsUnitsFilled) {
  const std::string layout = "--set parallel.stages=2 --set parallel.schedule=1f1b";
  const fs::path pdir = dir() / "ad_trace_profile";
  fs::remove_all(pdir);
  Launched r = launch(2, "ad_trace",
                      layout + " --set kfac.replan_on_drift=false --set kfac.placement=adaptive --set kfac.plan_profile=" +
                          made_up_plan_profile("ad_trace", layout, 2).string() +
                          " --bench-slow 1:3 --bench-jitter 0.2 --profile-dir " + pdir.string() +
                          " --profile-steps 1,2,3,4,5,6,7,8");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string tag = "pipefisher: adaptive: ";
  const size_t at = r.out.find(tag);
  ASSERT_NE(at, std::string::npos) << r.out;
  const long in_waits = std::stol(r.out.substr(at + tag.size()));
  const nlohmann::json trace = read_json(pdir / "trace.json");
  // The receives of each (device, step), by action token, with their ends (us).
  std::map<std::tuple<int, int, std::string>, double> recv_end;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X" && e.contains("args") && e["args"].contains("action") &&
        e["args"]["action"].get<std::string>().find("RECV") != std::string::npos)
      recv_end[{e["pid"].get<int>(), e["args"]["step"].get<int>(), e["args"]["action"].get<std::string>()}] =
          e["ts"].get<double>() + e["dur"].get<double>();
  long marked = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (!e.contains("args") || !e["args"].contains("in_wait_of")) continue;
    ++marked;
    const std::string unit = e["args"]["action"], recv = e["args"]["in_wait_of"];
    EXPECT_TRUE(unit.find("CURV_") != std::string::npos || unit.find("INV_") != std::string::npos) << unit;
    const auto it = recv_end.find({e["pid"].get<int>(), e["args"]["step"].get<int>(), recv});
    ASSERT_NE(it, recv_end.end()) << unit << " in the wait of " << recv << ", which the trace does not hold";
    // The message came after the unit ended (tested between units), so the receive ends after it.
    EXPECT_LE(e["ts"].get<double>() + e["dur"].get<double>(), it->second + 1e-3) << unit << " in " << recv;
  }
  EXPECT_EQ(marked, in_waits) << r.out;
  bool svg_marks = false;
  for (int s = 1; s <= 8; ++s)
    svg_marks = svg_marks || bytes(pdir / ("timeline-step" + std::to_string(s) + ".svg")).find(" in the wait of ") !=
                                 std::string::npos;
  EXPECT_EQ(svg_marks, in_waits > 0);
}
