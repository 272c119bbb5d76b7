// `pipefisher plan --kfac` end to end: the `kfac` JSON on a hand-computable case, the SVG of
// the refresh period, and bad arguments (exit 2, one line).
#include <unistd.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <fmt/format.h>

#include <array>
#include <vector>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sys/wait.h>

#include "plan_cli.hpp"

namespace {

using namespace pf::test;

TEST(PlanKfacCli, HandComputableJson) {
  // GPipe D = N = 2, T_f 1, T_b 2, PREC 0.5: step 9.5 (device 0 adds PREC at the end, device 1
  // in its tail gap), 3 of bubble per device; curvature 1 per micro-batch and inversion 1 per
  // stage: ceil((2 * 1 + 1) / 3) = 1 step at best; curvature B of micro-batch 1 is ready only at
  // device 0's end of step, so 2 steps; busy 2 * 6.5 + 3 over 19. By default exact factors: no
  // split to shorten the refresh period (--split-to-shorten, below).
  PlanRun r = plan("--kfac --schedule gpipe --stages 2 --micro-batches 2 --tcurv 1 --tinv 1 --tprec 0.5 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out)["kfac"];
  EXPECT_EQ(j["refresh_steps"], nlohmann::json({2, 2}));
  EXPECT_EQ(j["lower_bound_refresh_steps"], nlohmann::json({1, 1}));
  EXPECT_DOUBLE_EQ(j["step_time"].get<double>(), 9.5);
  EXPECT_DOUBLE_EQ(j["inline_time"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(j["utilization"].get<double>(), 16.0 / 19.0);
  EXPECT_EQ(j["splits"].size(), 0u);
  EXPECT_EQ(j["per_device"][1]["bubble"].get<double>(), 3);
  // --split-to-shorten: device 1 splits its inversion (2 blocks, 1/4 of the work) and refreshes
  // every step.
  PlanRun d = plan("--kfac --schedule gpipe --stages 2 --micro-batches 2 --tcurv 1 --tinv 1 --tprec 0.5 --json "
                   "--split-to-shorten");
  ASSERT_EQ(d.status, 0) << d.err;
  auto k = nlohmann::json::parse(d.out)["kfac"];
  EXPECT_EQ(k["refresh_steps"], nlohmann::json({2, 1}));
  ASSERT_EQ(k["splits"].size(), 1u);
  EXPECT_EQ(k["splits"][0]["stage"], 1);
  expect_usage("--schedule gpipe --stages 2 --micro-batches 2 --split-to-shorten",
               "pipefisher: --split-to-shorten: only applies with --kfac");
}

// Messages between stages take time (--tcomm): the planner's step without K-FAC is the plain
// simulation's, and PREC at device 0's end lengthens it by exactly T_prec.
TEST(PlanKfacCli, PlannerStepWithoutKfacIsThePlainStep) {
  PlanRun r = plan("--kfac --schedule gpipe --stages 2 --micro-batches 2 --tcomm 0.25 --tcurv 1 --tinv 1 --tprec 0.5 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_DOUBLE_EQ(j["step_time"].get<double>(), 9 + 2 * 0.25);  // F F, then B B, one message each way
  EXPECT_DOUBLE_EQ(j["kfac"]["plain_step_time"].get<double>(), j["step_time"].get<double>());
  EXPECT_DOUBLE_EQ(j["kfac"]["base_step_time"].get<double>(), j["step_time"].get<double>() + 0.5);
}

// Zero-bubble W moved before the K-FAC units, in the text and the JSON. ZB-H1, D = N = 3, T_f =
// T_i = 1, T_w = 0.5, no margin, by hand: device 1 runs F0 [1,2] F1 [2,3] I0 [4,5] F2 [5,6] I1
// [6,7] W0 [7,7.5], waits for I2's gradient until 8, then I2 W1 W2; W1 (ready at 7.5, after I1 and
// W0) fits the wait and moves there; the step stays 10.5 (device 0's end). With the default
// margin W1 needs 0.525 of the 0.5: nothing moves. Without W, no report.
TEST(PlanKfacCli, ZeroBubbleWMovedIntoEarlierGapsIsReported) {
  const std::string zb = "--kfac --schedule zb-h1 --stages 3 --micro-batches 3 --tf 1 --tb 1 --tw 0.5 --tcurv 0.1 "
                         "--tinv 0.2 --tprec 0.1";
  PlanRun r = plan(zb + " --margin 0 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json w = nlohmann::json::parse(r.out)["kfac"]["weight_gradients"];
  EXPECT_EQ(w["total"].get<int>(), 9);
  EXPECT_EQ(w["moved"].get<int>(), 1);
  EXPECT_DOUBLE_EQ(w["step_before"].get<double>(), 10.5);
  EXPECT_DOUBLE_EQ(w["step_after"].get<double>(), 10.5);
  PlanRun t = plan(zb);
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_NE(t.out.find("\nzero-bubble W: 0 of 9 moved into earlier gaps, step 10.500 -> 10.500 without K-FAC work\n"),
            std::string::npos) << t.out;
  PlanRun f = plan("--kfac --schedule 1f1b --stages 3 --micro-batches 3 --json");
  ASSERT_EQ(f.status, 0) << f.err;
  EXPECT_FALSE(nlohmann::json::parse(f.out)["kfac"].contains("weight_gradients"));
}

TEST(PlanKfacCli, NoBubbleRunsInlineAndTheSummarySaysSo) {
  PlanRun r = plan("--kfac --schedule gpipe --stages 1 --micro-batches 2 --tcurv 1 --tinv 1 --tprec 0.5 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out)["kfac"];
  EXPECT_EQ(j["refresh_steps"], nlohmann::json({1}));
  EXPECT_TRUE(j["lower_bound_refresh_steps"][0].is_null());
  EXPECT_NEAR(j["inline_time"].get<double>(), 3, 1e-12);  // 2 micro-batches x 1 + 1 (summed per factor)
  EXPECT_NEAR(j["step_time"].get<double>(), 6 + 0.5 + 3, 1e-12);
  PlanRun t = plan("--kfac --schedule gpipe --stages 1 --micro-batches 2 --tcurv 1 --tinv 1 --tprec 0.5");
  EXPECT_NE(t.out.find("inline work on the critical path 3.000 per refresh"), std::string::npos) << t.out;
}

TEST(PlanKfacCli, SvgShowsEveryStepOfTheRefreshPeriod) {
  const std::string svg = tmp("kfac.svg");
  PlanRun r = plan("--kfac --schedule 1f1b --stages 4 --micro-batches 4 --tcurv 3 --tinv 10 --tprec 0.5 --svg " + svg);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string s = slurp(svg);
  for (const char* want : {"curvature A", "curvature B", "inversion A", "inversion B", "precondition", "step 1", "step 2"})
    EXPECT_NE(s.find(want), std::string::npos) << want;
}

TEST(PlanKfacCli, ReplicasPlaceInversionsByAlgorithm1AndDrawTheBroadcasts) {
  // bert-base shapes, --tinv 100 split by d^3: a 768-wide inversion 0.725 ms, a 3072-wide one
  // 46.4 ms; broadcast 1.2e-6 ms per byte of the upper triangle: 1.42 ms and 22.7 ms. So per
  // stage the ten 768-wide factors are NCT (inverted by both replicas) and the two 3072-wide
  // ones CT: the first to replica 0, the second to the then least loaded replica 1.
  const std::string svg = tmp("w2.svg"), trace = tmp("w2.json");
  const std::string args = "--kfac --schedule 1f1b --stages 4 --micro-batches 4 --tf 20 --tb 40 --tcurv 3 --tinv 100 "
                           "--tprec 0.5 --data-parallel 2 --bcast-alpha 0 --bcast-beta 1.2e-6";
  PlanRun r = plan(args + " --json --svg " + svg + " --trace " + trace);
  ASSERT_EQ(r.status, 0) << r.err;
  auto k = nlohmann::json::parse(r.out)["kfac"];
  ASSERT_EQ(k["placement"].size(), 4u);
  for (const auto& sp : k["placement"]) {
    EXPECT_EQ(sp["communicated"], 2);
    EXPECT_EQ(sp["non_communicated"], 10);
    std::vector<int> owners;
    double nct = 0, ct_load = 0;
    for (const auto& p : sp["pieces"]) {
      const bool wide = p["dim"] == 3072;
      EXPECT_EQ(p["communicated"].get<bool>(), wide) << p.dump();
      EXPECT_NEAR(p["broadcast"].get<double>(), 1.2e-6 * 4 * p["dim"].get<double>() * (p["dim"].get<double>() + 1) / 2, 1e-9);
      if (wide) {
        owners.push_back(p["owner"].get<int>());
        ct_load = p["inversion"].get<double>() + p["broadcast"].get<double>();
      } else {
        EXPECT_EQ(p["owner"], "every");
        nct += p["inversion"].get<double>();
      }
    }
    EXPECT_EQ(owners, std::vector<int>({0, 1}));
    EXPECT_NEAR(sp["load"][0].get<double>(), nct + ct_load, 1e-9);
    EXPECT_NEAR(sp["load"][1].get<double>(), nct + ct_load, 1e-9);
  }
  // The timelines show the factor communication: broadcast units in the drawing and the trace.
  EXPECT_NE(slurp(svg).find("broadcast inverse"), std::string::npos);
  EXPECT_NE(slurp(trace).find("BCAST_INV_"), std::string::npos);
  PlanRun t = plan(args);
  EXPECT_NE(t.out.find("stage 0 (holders device.replica 0.0, 0.1): 2 inversion pieces inverted by one holder and broadcast, 10 by every holder; modelled inversion time per holder 76.3, 76.3 ms\n"),
            std::string::npos) << t.out;
  // Chimera lists each twin pair under both pipelines' copies of a stage: one line per stage.
  PlanRun c = plan("--kfac --schedule chimera --stages 4 --micro-batches 4 --tcurv 1 --tinv 40 --tprec 1");
  ASSERT_EQ(c.status, 0) << c.err;
  for (int stage = 0; stage < 4; ++stage) {
    const std::string line = fmt::format("\nstage {} (holders device.replica {}.0, {}.0): ", stage, stage, 3 - stage);
    EXPECT_EQ(c.out.find(line), c.out.rfind(line)) << c.out;
    EXPECT_NE(c.out.find(line), std::string::npos) << c.out;
  }
  expect_usage("--kfac --schedule 1f1b --stages 4 --micro-batches 4 --bcast-beta -1", "pipefisher: --bcast-beta: ");
  expect_usage("--schedule 1f1b --stages 4 --micro-batches 4 --bcast-alpha 1", "pipefisher: --bcast-alpha: only applies with --kfac");
}

TEST(PlanKfacCli, BadArgumentsExitTwoWithOneLine) {
  expect_usage("--schedule 1f1b --stages 4 --micro-batches 4 --margin 0.1", "pipefisher: --margin: only applies with --kfac");
  expect_usage("--kfac --schedule 1f1b --stages 4 --micro-batches 4 --model nope", "pipefisher: --model: unknown preset 'nope'");
  expect_usage("--kfac --schedule 1f1b --stages 4 --micro-batches 4 --data-parallel 0", "pipefisher: --data-parallel: ");
  expect_usage("--kfac --schedule 1f1b --stages 4 --micro-batches 4 --margin -1", "pipefisher: --margin: ");
  expect_usage("--kfac --sweep --schedule chimera", "pipefisher: --kfac: not available with --sweep");
}

}  // namespace

namespace {

// The paper's published profiles (data/profiles): every one reads, and Figure 4's setting plans
// as the planner test says (tests/sim/test_planner_prec.cpp: PlannerPaper.Figure4BertLargeChimeraP100).
TEST(PlanKfacCli, PaperProfilesFromTheRepository) {
  const std::string dir = std::string(PF_SOURCE_DIR) + "/data/profiles/";
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".csv") continue;
    ++files;
    PlanRun r = plan("--schedule chimera --stages 4 --micro-batches 4 --micro-batch-size 8 --json --profile " +
                     e.path().string());
    ASSERT_EQ(r.status, 0) << e.path() << r.err;
    EXPECT_GT(nlohmann::json::parse(r.out)["step_time"].get<double>(), 0) << e.path();
  }
  EXPECT_EQ(files, 18);
  PlanRun r = plan("--kfac --schedule chimera --stages 8 --micro-batches 8 --profile " + dir +
                   "bert-large_p100.csv --micro-batch-size 32 --layers-per-stage 3 --model bert-large --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto k = nlohmann::json::parse(r.out)["kfac"];
  EXPECT_EQ(k["refresh_steps"], nlohmann::json({3, 4, 4, 3, 3, 4, 4, 3}));
  EXPECT_EQ(k["splits"].size(), 0u);
  EXPECT_GT(k["utilization"].get<double>(), 0.955);
  // The twins' placements: every stage's pieces over 2 holders, all broadcast (no broadcast model).
  ASSERT_EQ(k["placement"].size(), 16u);
  for (const auto& sp : k["placement"]) {
    EXPECT_EQ(sp["non_communicated"], 0);
    // Members: the stage's pipeline-0 copy (device = stage) and pipeline-1 copy (device 7 - stage).
    const int st = sp["stage"].get<int>();
    EXPECT_EQ(sp["members"], nlohmann::json::parse(fmt::format(R"([{{"device":{},"replica":0}},{{"device":{},"replica":0}}])",
                                                                 st, 7 - st)));
  }
  // The sweep's memory model per stage as the paper defines it: BERT-Base P100, micro-batch 32,
  // Chimera D = N = 4: M_kfac+ = M_curv + M_inv + N M_err^save = 94.5 + 94.5 + 4 x 108.
  PlanRun sw = plan("--sweep --schedule chimera --sweep-stages 4 --json --profile " + dir + "bert-base_p100.csv");
  ASSERT_EQ(sw.status, 0) << sw.err;
  int seen = 0;
  for (const auto& row : nlohmann::json::parse(sw.out))
    if (row["micro_batch_size"] == 32 && row["micro_batches"] == 4) {
      EXPECT_DOUBLE_EQ(row["m_kfac"].get<double>(), 621);
      ++seen;
    }
  EXPECT_EQ(seen, 1);
}

}  // namespace

// What a plan is computed from is said in its output, not only in --help: without durations the
// times are units (F = 1, B = 2); with --kfac and no K-FAC costs, K-FAC is planned at zero cost.
TEST(PlanKfacCli, OutputSaysWhenItUsesUnitCostsOrFreeKfac) {
  PlanRun units = plan("--schedule 1f1b --stages 2 --micro-batches 2");
  ASSERT_EQ(units.status, 0) << units.err;
  EXPECT_NE(units.out.find("(times in units)\nwarning: no durations given (--profile, or --tf and --tb): every "
                           "forward takes 1 and every backward 2"), std::string::npos) << units.out;
  PlanRun free = plan("--kfac --schedule 1f1b --stages 2 --micro-batches 2 --tf 1 --tb 2 --json");
  ASSERT_EQ(free.status, 0) << free.err;
  const nlohmann::json j = nlohmann::json::parse(free.out);
  EXPECT_EQ(j["time_unit"], "ms");
  ASSERT_EQ(j["warnings"].size(), 1u) << free.out;
  EXPECT_EQ(j["warnings"][0].get<std::string>().rfind("no K-FAC costs given", 0), 0u) << free.out;
  PlanRun both = plan("--kfac --schedule 1f1b --stages 2 --micro-batches 2 --json");
  EXPECT_EQ(nlohmann::json::parse(both.out)["warnings"].size(), 2u) << both.out;
  EXPECT_EQ(nlohmann::json::parse(both.out)["time_unit"], "unit") << both.out;
  PlanRun costed = plan("--kfac --schedule 1f1b --stages 2 --micro-batches 2 --tf 1 --tb 2 --tcurv 1 --tinv 1 --tprec 0.5");
  ASSERT_EQ(costed.status, 0) << costed.err;
  EXPECT_EQ(costed.out.find("warning"), std::string::npos) << costed.out;
}
