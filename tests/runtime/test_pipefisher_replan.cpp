// The plan changes inside a run: re-plan on drift, and when kfac.split_inversions splits
// inversions to shorten the refresh.
#include "pipefisher_fixture.hpp"
#include "runtime/pipefisher/controller.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

using namespace pf_test::pipefisher;

// Re-plan on drift: a test hook counts steps 4, 5, 6 as 10x their measured forward/backward time;
// after the third step over 1.3x the profile every rank finishes its cycle, then all re-profile
// and re-plan. Both plans are made from fixed costs (--test-fixed-costs): a plan from a loaded
// machine's timings once needed 13 steps per cycle and left no step for the re-profile. The refresh record carries the
// new pattern (profiling refreshes inside the run, then the new plan's), and the weights still
// equal the single process following it.
TEST(PipeFisherRuntime, DriftReplansAndStillEqualsSingleProcess) {
  struct Case {
    std::string name;
    int ranks;
    std::string sets;
    std::vector<std::string> cfg;
  };
  for (const Case& c :
       {Case{"drift_1f1b", 2, "--set parallel.stages=2 --set parallel.schedule=1f1b", {}},
        Case{"drift_chimera", 2, "--set parallel.stages=2 --set parallel.schedule=chimera", {}},
        // Twins share inversions, each pair with its own cycle, inversions wrapped up to step K.
        Case{"drift_chimera_4", 4, "--set parallel.stages=4 --set parallel.schedule=chimera", {}},
        // K-FAC costs 3x the fixed ones: the cycle's last units wrap into the next cycle's first
        // step, so the re-profile's first step starts with them (once ran off its profile list);
        // with split inversions (6 here, cycles of 5 and 6 steps).
        Case{"drift_wrapped", 2, "--set parallel.stages=2 --set parallel.schedule=1f1b --set kfac.split_inversions=true",
             {"kfac.split_inversions=true"}},
        Case{"drift_2x2", 4,
             "--set parallel.stages=2 --set parallel.schedule=1f1b --set parallel.data_parallel=2 "
             "--set parallel.micro_batches=2",
             {"parallel.data_parallel=2", "parallel.micro_batches=2"}}}) {
    const std::string seams =
        std::string("--test-drift-at 5 --test-fixed-costs") + (c.name == "drift_chimera"   ? " --test-kfac-cost-scale 0.0001"
                                                  : c.name == "drift_chimera_4" ? " --test-kfac-cost-scale 0.05"
                                                  : c.name == "drift_wrapped" ? " --test-kfac-cost-scale 3"
                                                                              : "");
    Launched r = launch(c.ranks, c.name, c.sets + " --set train.steps=14 --set kfac.placement=bubbles " + seams);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("re-profiling from step"), std::string::npos) << r.out;
    // Planned twice: after steps 1-2 and after the re-profile; from the same fixed costs, the
    // same plan (measured ones would differ at least in the predicted step).
    std::vector<std::string> plans;
    for (size_t at = r.out.find("pipefisher: planned from"); at != std::string::npos;
         at = r.out.find("pipefisher: planned from", at + 1))
      plans.push_back(r.out.substr(r.out.find("refresh every", at), r.out.find('\n', at) - r.out.find("refresh every", at)));
    ASSERT_GE(plans.size(), 2u) << r.out;
    EXPECT_EQ(plans[0], plans[1]) << r.out;
    std::ifstream f(dir() / c.name / "kfac_refresh.json");
    const nlohmann::json rec = nlohmann::json::parse(f);
    // Refreshed every step while re-profiling (from step 5 at the earliest): two consecutive steps
    // each use their own factors.
    std::map<int64_t, int> fresh;  // step -> inverses built from that very step
    for (const auto& e : rec["events"])
      if (e["use_step"] == e["curv_step"]) ++fresh[e["use_step"].get<int64_t>()];
    int reprofiled = 0;
    for (auto& [t, n] : fresh) reprofiled += t >= 5 && fresh.count(t + 1);
    EXPECT_GT(reprofiled, 0) << rec.dump(1);
    std::vector<std::string> sets = c.cfg;
    sets.push_back("train.steps=14");
    pf::Config cfg = load_config(sets);
    cfg.kfac.placement = pf::Placement::Inline;
    expect_close(saved_weights(dir() / (c.name + ".safetensors")), reference_following(cfg, rec), c.name);
  }
}

// kfac.split_inversions: off by default (exact factors): a factor is split into diagonal blocks
// only when no gap holds it (paper A.2), never to shorten the refresh period. From a profile in
// which every inversion fits a gap but all of them need several steps, the planner splits none
// when it is off and splits to need fewer steps when it is on.
TEST(PipeFisherRuntime, SplitInversionsOnlyWhenAsked) {
  struct Planned {
    int splits = -1, refresh = -1;  // split inversions; the longest device's refresh period
  };
  auto planned = [](const Launched& r) {
    Planned p;
    const size_t at = r.out.find("pipefisher: planned from");
    EXPECT_NE(at, std::string::npos) << r.out;
    if (at == std::string::npos) return p;
    const size_t line_end = r.out.find('\n', at);
    std::istringstream line(r.out.substr(at, line_end - at));
    std::string word, prev;
    int every = 0;
    for (int n; line >> word; prev = word) {
      if (prev == "every") every = 1;
      if (every && word != "steps" && std::sscanf(word.c_str(), "%d", &n) == 1) p.refresh = std::max(p.refresh, n);
      if (word == "steps") every = 0;
      if (word == "split" && std::sscanf(prev.c_str(), "%d", &n) == 1) p.splits = n;
    }
    return p;
  };
  const std::string sets = "--set parallel.stages=2 --set parallel.schedule=1f1b --set kfac.placement=bubbles "
                           "--set train.steps=4 --set kfac.replan_on_drift=false";
  Launched recorded = launch(2, "split_record", sets);
  ASSERT_EQ(recorded.status, 0) << recorded.out;
  const fs::path profile =
      made_up_profile(dir() / "split_record" / "kfac_profile.json", sets, 2, dir() / "split_profile.json");
  const std::string from = sets + " --set kfac.plan_profile=" + profile.string();
  Launched on = launch(2, "split_on", from + " --set kfac.split_inversions=true");
  ASSERT_EQ(on.status, 0) << on.out;
  Launched off = launch(2, "split_off", from);
  ASSERT_EQ(off.status, 0) << off.out;
  const Planned a = planned(on), b = planned(off);
  EXPECT_EQ(b.splits, 0) << off.out;
  EXPECT_GT(a.splits, 0) << on.out;
  EXPECT_GT(b.refresh, 0) << off.out;
  EXPECT_LT(a.refresh, b.refresh) << on.out << off.out;
}

namespace {

// The refresh cycles of every "pipefisher: planned from ..." line whose source contains `from`,
// in order ("every 3 2 steps" -> {3, 2}).
std::vector<std::vector<int>> planned_cycles(const std::string& out, const std::string& from) {
  std::vector<std::vector<int>> cycles;
  const std::string tag = "pipefisher: planned from ";
  for (size_t at = out.find(tag); at != std::string::npos; at = out.find(tag, at + 1)) {
    const std::string line = out.substr(at, out.find('\n', at) - at);
    const size_t every = line.find("refresh every ");
    if (line.find(from) == std::string::npos || every == std::string::npos) continue;
    std::istringstream words(line.substr(every + 14));
    std::vector<int> c;
    for (int r; words >> r;) c.push_back(r);
    cycles.push_back(c);
  }
  return cycles;
}

int longest(const std::vector<int>& cycles) { return *std::max_element(cycles.begin(), cycles.end()); }

// A re-plan at other K-FAC costs may also split a factor or run a unit inline where the run's plan
// did not, or (on a loaded machine, where every measured time stretches) need the same cycles; the
// run then keeps its plan. True when no re-plan was refused for anything else.
bool refused_only_for_splits_or_inline(const std::vector<std::string>& reasons) {
  for (const std::string& r : reasons)
    if (r != "other factor splits" && r != "more inline work") return false;
  return true;
}

// One adaptive run on 2 ranks x 1F1B, 16 steps: its plans from the profile and from the steps
// as run, and the weights against the single process following its record.
struct AdaptedRun {
  std::string out;
  std::vector<std::vector<int>> profiled, adapted;
  std::vector<std::string> not_taken;  // the reasons of re-plans the run did not switch to
  nlohmann::json record;
};
AdaptedRun adaptive_run(const std::string& name, const std::string& scales, const std::string& sets,
                        std::vector<std::string> cfg_sets) {
  AdaptedRun a;
  Launched r = launch(2, name,
                      "--set parallel.stages=2 --set parallel.schedule=1f1b --set kfac.placement=adaptive "
                      "--set kfac.replan_on_drift=false --set train.steps=16 " + sets,
                      "--test-kfac-cost-scale " + scales);
  EXPECT_EQ(r.status, 0) << r.out;
  if (r.status != 0) return a;
  a.out = r.out;
  a.profiled = planned_cycles(r.out, "profiled steps");
  a.adapted = planned_cycles(r.out, "as run (adaptive");
  const std::string tag = "not taken: ";
  for (size_t at = r.out.find(tag); at != std::string::npos; at = r.out.find(tag, at + 1))
    a.not_taken.push_back(r.out.substr(at + tag.size(), r.out.find('\n', at) - at - tag.size()));
  std::ifstream f(dir() / name / "kfac_refresh.json");
  a.record = nlohmann::json::parse(f);
  cfg_sets.push_back("train.steps=16");
  pf::Config cfg = load_config(cfg_sets);
  cfg.kfac.placement = pf::Placement::Inline;
  expect_close(saved_weights(dir() / (name + ".safetensors")), reference_following(cfg, a.record), name);
  return a;
}

}  // namespace

// adaptive: the refresh cycles follow the bubbles as run, within the user's bounds. The K-FAC units
// as the planner sees them: at 1/10000 of their cost every unit fits the first bubble it can use
// (the shortest cycles the schedule allows: device 0's last curvature waits for the next step), at
// 3x they need several steps. Re-plans look at the first cycle start of every device kAdaptSteps
// (6) steps after the plan; each run's record carries its pattern, and its weights equal the single
// process following the record.
//   short to long: by default a re-plan never refreshes less often than the profile's plan (a quiet
//     run keeps bubbles' cycles), so nothing switches; kfac.max_refresh_steps = 50 lets them grow.
//   long to short: every rank switches to the shortest cycles; with kfac.min_refresh_steps = 2 both
//     plans keep two steps or more, the re-plan exactly two.
// Timing decides the cycles, so on a loaded machine a re-plan may need the same cycles, or split a
// factor where the plan did not (then nothing switches), and a later re-plan may switch again (the
// first switch is checked exactly, each later one against the bounds); what must never happen is
// a switch the bounds forbid, a refusal they do not explain, or a record the single process cannot
// follow.
TEST(PipeFisherAdaptive, RefreshCyclesFollowTheBubblesWithinTheUsersBounds) {
  const AdaptedRun bounded = adaptive_run("adapt_bounded", "0.0001,3", "", {});
  ASSERT_EQ(bounded.profiled.size(), 1u);
  const std::vector<int> shortest = bounded.profiled[0];
  EXPECT_TRUE(bounded.adapted.empty());
  for (const std::string& r : bounded.not_taken)
    EXPECT_NE(r.find("over the profile's plan's"), std::string::npos) << bounded.out;
  EXPECT_EQ(bounded.record["plan_start"], 2);

  const AdaptedRun longer = adaptive_run("adapt_longer", "0.0001,3", "--set kfac.max_refresh_steps=50", {});
  if (longer.adapted.empty()) {
    EXPECT_TRUE(refused_only_for_splits_or_inline(longer.not_taken)) << longer.out;
  } else {
    EXPECT_GT(longest(longer.adapted[0]), longest(shortest));
    for (const std::vector<int>& cycles : longer.adapted) EXPECT_LE(longest(cycles), 50);
  }

  const AdaptedRun shorter = adaptive_run("adapt_shorter", "3,0.0001", "", {});
  ASSERT_EQ(shorter.profiled.size(), 1u);
  if (shorter.adapted.empty()) {
    EXPECT_TRUE(refused_only_for_splits_or_inline(shorter.not_taken)) << shorter.out;
  } else {
    EXPECT_EQ(shorter.adapted[0], shortest);
    for (const std::vector<int>& cycles : shorter.adapted) EXPECT_LE(longest(cycles), longest(shorter.profiled[0]));
    if (shorter.adapted.size() == 1)
      EXPECT_EQ(shorter.record["period"], std::lcm(shortest[0], shortest[1]));
    EXPECT_GE(shorter.record["plan_start"].get<int64_t>(), 2 + pf::kAdaptSteps);
  }

  if (shorter.profiled[0] == shortest) EXPECT_TRUE(shorter.adapted.empty());

  const AdaptedRun min2 = adaptive_run("adapt_shorter_min2", "3,0.0001", "--set kfac.min_refresh_steps=2", {});
  ASSERT_EQ(min2.profiled.size(), 1u);
  for (int r : min2.profiled[0]) EXPECT_GE(r, 2);
  if (min2.profiled[0] == std::vector<int>(2, 2)) {
    EXPECT_TRUE(min2.adapted.empty());
  } else if (min2.adapted.empty()) {
    EXPECT_TRUE(refused_only_for_splits_or_inline(min2.not_taken)) << min2.out;
  } else {
    EXPECT_EQ(min2.adapted[0], std::vector<int>(2, 2));
    for (const std::vector<int>& cycles : min2.adapted)
      for (int r : cycles) EXPECT_GE(r, 2);
    if (min2.adapted.size() == 1) EXPECT_EQ(min2.record["period"], 2);
  }
}
