// `pipefisher plan` end to end: runs the built program (PF_BINARY) and checks exit status,
// the one-line reasons for bad arguments, and the JSON numbers against the closed forms.
#include <unistd.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <sys/wait.h>

#include "plan_cli.hpp"
#include "schedule/action.hpp"
#include "viz/style.hpp"

namespace {

using namespace pf::test;

TEST(PlanCli, BadOrContradictoryArgumentsExitTwoWithOneLine) {
  const std::string bad_csv = tmp("bad.csv");
  std::ofstream(bad_csv) << "bs,time_f\n8,1\n";
  const std::string bad_json = tmp("bad.json");
  std::ofstream(bad_json) << "{\"format\": \"pipefisher-profile\"";
  expect_usage("--schedule chimera --stages 3 --micro-batches 6", "pipefisher: --stages: chimera needs an even number");
  expect_usage("--schedule 1f1b --stages 4 --micro-batches 4 --virtual-stages 2",
               "pipefisher: --virtual-stages: only applies to --schedule interleaved");
  expect_usage("--schedule foo --stages 4 --micro-batches 4", "pipefisher: --schedule: unknown schedule 'foo'");
  expect_usage("--schedule interleaved --stages 4 --micro-batches 6 --virtual-stages 2",
               "pipefisher: --micro-batches: interleaved 1F1B needs a multiple of --stages (4)");
  expect_usage("--schedule 1f1b --stages 4 --micro-batches 4 --profile /nonexistent/p.csv",
               "pipefisher: --profile: cannot open '/nonexistent/p.csv'");
  expect_usage("--schedule 1f1b --stages 4 --micro-batches 4 --profile " + bad_csv, "pipefisher: --profile (");
  expect_usage("--schedule 1f1b --stages 4 --micro-batches 4 --profile " + bad_json, "pipefisher: --profile: profile '");
  expect_usage("--schedule 1f1b --stages 4", "pipefisher: --micro-batches: required with --schedule");
  expect_usage("--stages 4 --micro-batches 4", "pipefisher: --schedule: give either --schedule NAME or --schedule-file FILE");
  expect_usage("--schedule 1f1b --stages 0 --micro-batches 4", "pipefisher: --stages: must be an integer >= 1");
  expect_usage("--schedule 1f1b --stages 4 --micro-batches 4 --tb -2", "pipefisher: --tb: must be a finite number of ms in [0, 9.007e+12]");
  expect_usage("--schedule-file /nonexistent/s.csv", "pipefisher: --schedule-file: cannot open");
  expect_usage("--schedule 1f1b --stages 4 --micro-batches 4 --svg /nonexistent-dir/t.svg", "pipefisher: --svg: cannot write");
}

TEST(PlanCli, JsonReportsTheClosedForm) {
  PlanRun r = plan("--schedule 1f1b --stages 4 --micro-batches 4 --tf 1.5 --tb 2.5 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["schedule"], "1f1b");
  EXPECT_EQ(j["stages"], 4);
  EXPECT_EQ(j["micro_batches"], 4);
  EXPECT_DOUBLE_EQ(j["step_time"].get<double>(), 7 * 4.0);
  EXPECT_DOUBLE_EQ(j["bubble_time"].get<double>(), 3 * 4.0);
  EXPECT_DOUBLE_EQ(j["utilization"].get<double>(), 4.0 / 7);
  ASSERT_EQ(j["per_device"].size(), 4u);
  EXPECT_DOUBLE_EQ(j["per_device"][2]["busy"].get<double>(), 16);
  EXPECT_EQ(j["peak_in_flight"], 4);
  EXPECT_TRUE(j["memory"].contains("m_pipe"));
  EXPECT_TRUE(j["memory"].contains("m_kfac"));

  PlanRun c = plan("--schedule chimera --stages 8 --micro-batches 8 --tf 1 --tb 2 --json");
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(c.out)["step_time"].get<double>(), 8 + 14 * 2.0);
}

TEST(PlanCli, PaperProfileRowAndLayerScaling) {
  const std::string csv = tmp("paper.csv");
  std::ofstream(csv) << "bs,time_f,time_b,time_kron,time_inv,time_prec,mem_param,mem_act,mem_peak_err,mem_save_err,mem_kron\n"
                        "16,5,8,13,80,9,27,80,20,12,168\n"
                        "32,10.25,16.5,27.45,80.85,8.90,27,160,40,24,168\n";
  PlanRun r = plan("--schedule gpipe --stages 4 --micro-batches 4 --profile " + csv + " --micro-batch-size 32 --layers-per-stage 3 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_NEAR(j["step_time"].get<double>(), 7 * 3 * (10.25 + 16.5), 1e-9);
  EXPECT_NEAR(j["memory"]["m_pipe"].get<double>(), 2 * 3 * 27 + 4 * 3 * 160 + 3 * 40, 1e-9);
  EXPECT_NEAR(j["memory"]["m_kfac"].get<double>(), 2 * 3 * 168 + 4 * 3 * 24, 1e-9);
  expect_usage("--schedule gpipe --stages 4 --micro-batches 4 --profile " + csv,
               "pipefisher: --micro-batch-size: '" + csv + "' has rows for bs 16, 32: pick one");
  expect_usage("--schedule gpipe --stages 4 --micro-batches 4 --profile " + csv + " --micro-batch-size 64",
               "pipefisher: --micro-batch-size: no row with bs=64");
  expect_usage("--schedule gpipe --stages 4 --micro-batches 4 --profile " + csv + " --micro-batch-size 16 --tf 3",
               "pipefisher: --tf: durations come from --profile");
}

// --partition gives each stage its blocks by the runtime's rule (parallel.partition,
// runtime/layout.hpp's partition_blocks): the per-block CSV profile is scaled stage by stage. Equal
// counts are --layers-per-stage; uneven ones make the heavy stages the busy ones (GPipe: a device
// is busy N (F + B) of its stage's blocks).
TEST(PlanCli, PartitionScalesEachStageByItsBlocks) {
  const std::string csv = tmp("paper-p.csv");
  std::ofstream(csv) << "bs,time_f,time_b,time_kron,time_inv,time_prec,mem_param,mem_act,mem_peak_err,mem_save_err,mem_kron\n"
                        "32,10.25,16.5,27.45,80.85,8.90,27,160,40,24,168\n";
  const std::string base = "--schedule gpipe --stages 4 --micro-batches 4 --model bert-base --profile " + csv;
  PlanRun even = plan(base + " --partition 3,3,3,3 --json"), uniform = plan(base + " --layers-per-stage 3 --json");
  ASSERT_EQ(even.status, 0) << even.err;
  EXPECT_EQ(even.out, uniform.out);
  PlanRun uneven = plan(base + " --partition 2,4,4,2 --json");
  ASSERT_EQ(uneven.status, 0) << uneven.err;
  const auto per = nlohmann::json::parse(uneven.out)["per_device"];
  EXPECT_NEAR(per[0]["busy"].get<double>(), 4 * 2 * (10.25 + 16.5), 1e-9);
  EXPECT_NEAR(per[1]["busy"].get<double>(), 4 * 4 * (10.25 + 16.5), 1e-9);
  EXPECT_NEAR(per[3]["busy"].get<double>(), per[0]["busy"].get<double>(), 1e-9);
  PlanRun kfac = plan(base + " --partition 2,4,4,2 --kfac --json");
  ASSERT_EQ(kfac.status, 0) << kfac.err;
  EXPECT_EQ(nlohmann::json::parse(kfac.out)["kfac"]["layers_per_stage"], nlohmann::json({2, 4, 4, 2}));
  expect_usage(base + " --partition 3,3,3", "pipefisher: --partition: lists 3 stages but the schedule has 4");
  expect_usage(base + " --partition 3,3,3,4",
               "pipefisher: --partition: assigns 13 transformer blocks but --model bert-base's layers = 12");
  expect_usage(base + " --partition 3,3,3,3 --layers-per-stage 3", "pipefisher: --partition: gives each stage's blocks");
  // --layers-per-stage meets the same bound: the model's depth.
  expect_usage(base + " --layers-per-stage 4 --kfac",
               "pipefisher: --layers-per-stage: 4 stages x 4 blocks = 16 transformer blocks, but --model bert-base has 12");
  EXPECT_EQ(plan(base + " --layers-per-stage 3 --kfac --json").status, 0);
  expect_usage("--schedule gpipe --stages 4 --micro-batches 4 --partition 3,3,3,3",
               "pipefisher: --partition: scales the paper's per-block CSV profile");
}

// --recompute (the runtime's parallel.recompute) outside a sweep: each backward carries its
// forward (GPipe 4x4: 7 slots of F + B + F), the activations fall from N M_act to one M_act per
// stage, both as the paper's closed form (layers_per_stage 3 scales them).
TEST(PlanCli, RecomputeAddsAForwardAndKeepsOneMicroBatch) {
  const std::string csv = tmp("paper-r.csv");
  std::ofstream(csv) << "bs,time_f,time_b,time_kron,time_inv,time_prec,mem_param,mem_act,mem_peak_err,mem_save_err,mem_kron\n"
                        "32,10.25,16.5,27.45,80.85,8.90,27,160,40,24,168\n";
  const std::string base = "--schedule gpipe --stages 4 --micro-batches 4 --profile " + csv + " --layers-per-stage 3 --json";
  PlanRun off = plan(base), on = plan(base + " --recompute");
  ASSERT_EQ(off.status, 0) << off.err;
  ASSERT_EQ(on.status, 0) << on.err;
  auto a = nlohmann::json::parse(off.out), b = nlohmann::json::parse(on.out);
  EXPECT_FALSE(a["recompute"].get<bool>());
  EXPECT_TRUE(b["recompute"].get<bool>());
  EXPECT_NEAR(b["step_time"].get<double>(), 7 * 3 * (2 * 10.25 + 16.5), 1e-9);
  EXPECT_NEAR(a["memory"]["activations"].get<double>(), 4 * 3 * 160, 1e-9);
  EXPECT_NEAR(b["memory"]["activations"].get<double>(), 3 * 160, 1e-9);
  EXPECT_NEAR(b["memory"]["activations_in_flight"].get<double>(), 3 * 160, 1e-9);
  EXPECT_LT(b["memory"]["m_pipe"].get<double>(), a["memory"]["m_pipe"].get<double>());
}

// --tw splits the backward: --tb is then I's time; zero-bubble schedules run W apart (ZB-H2's
// (D-1)T_f + N(T_f+T_i+T_w)), the others run B = I + W as if --tb were their sum.
TEST(PlanCli, WeightGradientTimeSplitsTheBackward) {
  auto step = [](const std::string& args) {
    PlanRun r = plan(args + " --stages 4 --micro-batches 8 --json");
    EXPECT_EQ(r.status, 0) << r.err;
    return r.status == 0 ? nlohmann::json::parse(r.out)["step_time"].get<double>() : -1.0;
  };
  EXPECT_DOUBLE_EQ(step("--schedule zb-h2 --tf 1 --tb 1 --tw 0.5"), 3 * 1 + 8 * 2.5);
  EXPECT_DOUBLE_EQ(step("--schedule zb-h1 --tf 1 --tb 1 --tw 0.5"), 8 * 2.5 + 3 * 1.5);
  EXPECT_DOUBLE_EQ(step("--schedule 1f1b --tf 1 --tb 1 --tw 0.5"), step("--schedule 1f1b --tf 1 --tb 1.5"));
  EXPECT_DOUBLE_EQ(step("--schedule zb-h2 --tf 1 --tb 2"), 3 * 1 + 8 * 3.0);  // without --tw, I = W = --tb / 2
  expect_usage("--schedule zb-h2 --stages 4 --micro-batches 3",
               "pipefisher: --micro-batches: zb-h2 needs at least as many micro-batches as stages (4)");
}

// The paper's CSV has the backward whole; zero-bubble schedules take W as its share by flops:
// BERT-Large's block (h 1024, ffn 4096, 128 tokens) has 12 h^2 weight-gradient multiply-adds per
// token against 24 h^2 + 4 * 128 h for the whole backward, 12 / 24.5.
TEST(PlanCli, PaperProfileSplitsTheBackwardByFlops) {
  const std::string csv = tmp("one_row.csv");
  std::ofstream(csv) << "bs,time_f,time_b,time_kron,time_inv,time_prec,mem_param,mem_act,mem_peak_err,mem_save_err,mem_kron\n"
                        "8,2,4,1,10,1,50,10,60,5,100\n";
  PlanRun r = plan("--schedule zb-h1 --stages 4 --micro-batches 8 --model bert-large --json --profile " + csv);
  ASSERT_EQ(r.status, 0) << r.err;
  const double tf = 2, tw = 4 * 12 / 24.5, ti = 4 - tw;
  // ZB-H1's closed form (T_W <= T_F): N (T_F + T_I + T_W) + (D - 1)(T_F + T_I - T_W).
  EXPECT_NEAR(nlohmann::json::parse(r.out)["step_time"].get<double>(), 8 * (tf + ti + tw) + 3 * (tf + ti - tw), 1e-9);
  PlanRun one = plan("--schedule 1f1b --stages 4 --micro-batches 8 --model bert-large --json --profile " + csv);
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_DOUBLE_EQ(nlohmann::json::parse(one.out)["step_time"].get<double>(), (8 + 3) * (tf + 4));
}

// Zero-bubble schedules draw W (the weight gradient) in its own colour: in the SVG every W box
// has W's fill, no I or B box has it, and the legend has one entry for it; in the trace each W
// event is in W's own category (the trace carries no colours: the viewer colours by name).
TEST(PlanCli, ZeroBubbleDrawsWeightGradientsInTheirOwnColour) {
  const std::string svg = tmp("zb_w.svg"), trace = tmp("zb_w.json");
  PlanRun r = plan("--schedule zb-h1 --stages 4 --micro-batches 8 --tw 1 --svg " + svg + " --trace " + trace);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string w = std::string(pf::kind_style(pf::Kind::W).color);
  // Each box: <rect ... fill="#rrggbb" ...><title>TOKEN [start, end]</title>.
  std::map<pf::Kind, std::set<std::string>> fills;
  const std::string text = slurp(svg);
  for (size_t at = text.find("<title>"); at != std::string::npos; at = text.find("<title>", at + 1)) {
    const size_t rect = text.rfind("<rect", at), fill = text.find("fill=\"", rect) + 6;
    const std::string token = text.substr(at + 7, text.find(' ', at) - at - 7);
    fills[pf::parse_token(token, svg).kind].insert(text.substr(fill, text.find('"', fill) - fill));
  }
  EXPECT_EQ(fills[pf::Kind::W], std::set<std::string>{w});
  ASSERT_FALSE(fills[pf::Kind::I].empty());
  EXPECT_FALSE(fills[pf::Kind::I].count(w));
  EXPECT_FALSE(fills[pf::Kind::F].count(w));
  EXPECT_EQ(fills.count(pf::Kind::B), 0u);  // the backward is split: I and W only
  EXPECT_NE(text.find("width=\"14\" height=\"14\" fill=\"" + w + "\"/><text"), std::string::npos);
  EXPECT_NE(text.find(">backward (weight grad)<"), std::string::npos);
  std::map<pf::Kind, std::set<std::string>> categories;
  const nlohmann::json events = nlohmann::json::parse(slurp(trace))["traceEvents"];
  for (const auto& e : events)
    if (e["ph"] == "X" && e.contains("args") && e["args"].contains("action"))
      categories[pf::parse_token(e["args"]["action"].get<std::string>(), trace).kind].insert(e["cat"].get<std::string>());
  EXPECT_EQ(categories[pf::Kind::W], std::set<std::string>{"backward (weight grad)"});
  EXPECT_EQ(categories[pf::Kind::I], std::set<std::string>{"backward (input grad)"});
}

TEST(PlanCli, CsvOutputFeedsBackThroughScheduleFile) {
  const std::string csv = tmp("sched.csv"), svg = tmp("t.svg"), trace = tmp("t.json");
  PlanRun a = plan("--schedule zb-h1 --stages 4 --micro-batches 8 --json --csv " + csv + " --svg " + svg + " --trace " + trace);
  ASSERT_EQ(a.status, 0) << a.err;
  PlanRun b = plan("--schedule-file " + csv + " --json");
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_EQ(nlohmann::json::parse(a.out)["step_time"], nlohmann::json::parse(b.out)["step_time"]);
  EXPECT_EQ(slurp(svg).rfind("<svg", 0), 0u);
  EXPECT_TRUE(nlohmann::json::parse(slurp(trace)).contains("traceEvents"));
  expect_usage("--schedule-file " + csv + " --stages 4", "pipefisher: --stages: comes from --schedule-file");
}

// torch.distributed.pipelining's form both ways: zb-v written for torchtitan reads back to the same
// step, and --kfac answers how much K-FAC fits its bubbles; Chimera has no torch form and is
// refused before any file is written.
TEST(PlanCli, TorchScheduleCsvBothWays) {
  const std::string csv = tmp("zbv.csv"), svg = tmp("zbv.svg");
  PlanRun a = plan("--schedule zb-v --stages 2 --micro-batches 4 --json --csv " + csv + " --csv-format torch");
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(slurp(csv).rfind("0F0,", 0), 0u) << slurp(csv);
  PlanRun b = plan("--schedule-file " + csv + " --json");
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_EQ(nlohmann::json::parse(a.out)["step_time"], nlohmann::json::parse(b.out)["step_time"]);
  PlanRun k = plan("--schedule-file " + csv + " --kfac --tcurv 0.2 --tinv 1 --tprec 0.1 --model bert-mini "
                   "--layers-per-stage 1");  // zb-v: 2 devices of 2 stages, a block each of bert-mini's 4
  ASSERT_EQ(k.status, 0) << k.err;
  EXPECT_NE(k.out.find("PipeFisher (bert-mini model shapes"), std::string::npos) << k.out;
  // Two step times, each named; the bound says what it bounds.
  EXPECT_NE(k.out.find("without K-FAC: step time "), std::string::npos) << k.out;
  EXPECT_NE(k.out.find("; step time with K-FAC "), std::string::npos) << k.out;
  EXPECT_NE(k.out.find("its bubbles alone would need at least ["), std::string::npos) << k.out;
  const std::string chimera = tmp("chimera.csv");
  PlanRun c = plan("--schedule chimera --stages 2 --micro-batches 2 --csv " + chimera + " --csv-format torch --svg " + svg);
  EXPECT_EQ(c.status, 2);
  EXPECT_NE(c.err.find("--csv-format: 'chimera' runs 2 pipelines"), std::string::npos) << c.err;
  EXPECT_FALSE(std::filesystem::exists(chimera));
  EXPECT_FALSE(std::filesystem::exists(svg)) << "refused before the first file";
}

TEST(PlanCli, BrokenScheduleFilePrintsTheMarkedGrid) {
  const std::string f = tmp("dead.txt");
  std::ofstream(f) << "# pipefisher schedule name=mine devices=2 stages=2 pipelines=1 micro_batches=2\n"
                      "0: 0F0 0B0 0F1 0B1\n"
                      "1: 1F1 1B1 1F0 1B0\n";
  PlanRun r = plan("--schedule-file " + f);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("*0B0*"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("dev 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("pipefisher: schedule: deadlock with blocking communication"), std::string::npos) << r.err;
}

TEST(PlanCli, HumanSummaryAndSweep) {
  PlanRun r = plan("--schedule 1f1b --stages 2 --micro-batches 1 --tf 1 --tb 1");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("step time 4.000, bubble 2.000 per device, utilization 50.0%"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("   1 |"), std::string::npos);
  const std::string csv = tmp("sweep.csv"), svg = tmp("sweep.svg");
  PlanRun s = plan("--sweep --schedule 1f1b --sweep-stages 2,4 --csv " + csv + " --svg " + svg);
  ASSERT_EQ(s.status, 0) << s.err;
  EXPECT_EQ(s.out, "outputs: " + svg + ", " + csv + "\n");  // what it wrote, and nothing else
  std::string table = slurp(csv);
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 7);
  EXPECT_NE(table.find("\n1f1b,1,4,4,21,9,"), std::string::npos) << table;
  expect_usage("--sweep --stages 4", "pipefisher: --stages: --sweep chooses D and N itself");
  expect_usage("--schedule 1f1b --stages 4 --micro-batches 4 --sweep-stages 4", "pipefisher: --sweep-stages: only applies with --sweep");
}

}  // namespace

// --steps and --width choose what --svg draws: one step has half the boxes of two, the time axis
// is as wide as asked (once wider than the title, the picture's width moves by the same pixels),
// and with --kfac a part of the refresh period can be drawn (the title says how much).
TEST(PlanCli, StepsAndWidthOfTheTimelinePicture) {
  auto svg_of = [](const std::string& args) {
    const std::string path = tmp("steps.svg");
    PlanRun r = plan("--schedule 1f1b --stages 4 --micro-batches 8 --svg " + path + " " + args);
    EXPECT_EQ(r.status, 0) << r.err;
    return slurp(path);
  };
  auto count = [](const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
    return n;
  };
  auto width = [](const std::string& s) { return std::stoi(s.substr(s.find("width=\"") + 7)); };
  const std::string one = svg_of("--steps 1 --width 1000"), two = svg_of("--steps 2 --width 1000"),
                    wide = svg_of("--steps 1 --width 1400");
  EXPECT_EQ(2 * count(one, "<title>"), count(two, "<title>"));
  EXPECT_EQ(width(wide) - width(one), 400);
  const std::string part = svg_of("--kfac --tcurv 0.3 --tinv 5 --tprec 0.5 --steps 1"),
                    period = svg_of("--kfac --tcurv 0.3 --tinv 5 --tprec 0.5");
  EXPECT_NE(part.find("refresh period 3 steps (1 drawn)"), std::string::npos) << part.substr(0, 600);
  EXPECT_LT(count(part, "<title>"), count(period, "<title>"));
  expect_usage("--schedule 1f1b --stages 4 --micro-batches 8 --steps 2", "pipefisher: --steps: only applies to a timeline's --svg");
  expect_usage("--schedule 1f1b --stages 4 --micro-batches 8 --svg " + tmp("x.svg") + " --width 50",
               "pipefisher: --width: must be 200 to 16000 px, got 50");
  expect_usage("--schedule 1f1b --stages 4 --micro-batches 8 --svg " + tmp("x.svg") + " --steps 99",
               "pipefisher: --steps: at most 32 steps in one picture, got 99");
}
