// The plan changes inside a run: re-plan on drift, and when kfac.split_inversions splits
// inversions to shorten the refresh.
#include "pipefisher_fixture.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

using namespace pf_test::pipefisher;

// Re-plan on drift: a test hook counts steps 4, 5, 6 as 10x their measured forward/backward time;
// after the third step over 1.3x the profile every rank finishes its cycle, then all re-profile
// and re-plan. The refresh record carries the
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
        // K-FAC costs 3x as measured: the cycle's last units wrap into the next cycle's first
        // step, so the re-profile's first step starts with them (once ran off its profile list).
        // Splitting to shorten the refresh keeps the cycle short enough to re-plan within the run
        // (exact factors, the default, need over 13 steps here).
        Case{"drift_wrapped", 2, "--set parallel.stages=2 --set parallel.schedule=1f1b --set kfac.split_inversions=true",
             {"kfac.split_inversions=true"}},
        Case{"drift_2x2", 4,
             "--set parallel.stages=2 --set parallel.schedule=1f1b --set parallel.data_parallel=2 "
             "--set parallel.micro_batches=2",
             {"parallel.data_parallel=2", "parallel.micro_batches=2"}}}) {
    const std::string seams =
        std::string("--test-drift-at 5") + (c.name == "drift_chimera"   ? " --test-kfac-cost-scale 0.0001"
                                                  : c.name == "drift_chimera_4" ? " --test-kfac-cost-scale 0.05"
                                                  : c.name == "drift_wrapped" ? " --test-kfac-cost-scale 3"
                                                                              : "");
    Launched r = launch(c.ranks, c.name, c.sets + " --set train.steps=14 --set kfac.placement=bubbles " + seams);
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("re-profiling from step"), std::string::npos) << r.out;
    // Planned twice: after steps 1-2 and after the re-profile.
    size_t plans = 0;
    for (size_t at = r.out.find("pipefisher: planned from"); at != std::string::npos;
         at = r.out.find("pipefisher: planned from", at + 1))
      ++plans;
    EXPECT_GE(plans, 2u) << r.out;
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
