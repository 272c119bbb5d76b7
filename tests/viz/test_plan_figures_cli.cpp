// Issue 15's figures and profiles through `pipefisher plan`: the K-FAC SVG's title says what the
// report says, docs/plan-and-report.md's sweep command draws a real chart, --data-parallel without --kfac, the
// memory model for every preset, and a profile that carries its run's shape.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>

#include "plan_cli.hpp"

namespace {

using namespace pf::test;
using nlohmann::json;

// The title line of a timeline SVG.
std::string svg_title(const std::string& svg) {
  const size_t b = svg.find("font-weight=\"bold\">");
  if (b == std::string::npos) return "";
  const size_t s = b + 19;
  return svg.substr(s, svg.find("</text>", s) - s);
}

TEST(PlanFigures, KfacSvgTitleSaysWhatTheReportSays) {
  // docs/plan-and-report.md's command (BERT-Large shapes, 8 stages): the title's refresh period, step, utilization
  // and bubble are the JSON report's numbers, as printed with their decimals.
  const std::string svg = tmp("pf.svg");
  PlanRun r = plan("--kfac --schedule 1f1b --stages 8 --micro-batches 8 --tf 31.17 --tb 48.84 --tcurv 82.35 --tinv "
                   "242.55 --tprec 26.7 --model bert-large --layers-per-stage 3 --json --svg " + svg);
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  const json& k = j["kfac"];
  const std::string title = svg_title(slurp(svg));
  const std::string want = fmt::format("refresh period {} steps, step {:.2f} ms, utilization {:.1f}%, bubble {:.2f} ms "
                                       "per device per step before K-FAC",
                                       k["period"].get<int>(), k["step_time"].get<double>(),
                                       100 * k["utilization"].get<double>(), j["bubble_time"].get<double>());
  EXPECT_NE(title.find(want), std::string::npos) << title << "\nwant: " << want;
  EXPECT_EQ(title.find("— step "), std::string::npos) << title;  // the period is not called a step
  // The text report prints the same numbers.
  PlanRun t = plan("--kfac --schedule 1f1b --stages 8 --micro-batches 8 --tf 31.17 --tb 48.84 --tcurv 82.35 --tinv "
                   "242.55 --tprec 26.7 --model bert-large --layers-per-stage 3");
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_NE(t.out.find(fmt::format("bubble {:.3f} per device", j["bubble_time"].get<double>())), std::string::npos);
  EXPECT_NE(t.out.find(fmt::format("step time with K-FAC {:.3f} (the refresh period's mean", k["step_time"].get<double>())),
            std::string::npos);
}

TEST(PlanFigures, KfacTraceNamesUnitsByTheModelsLayers) {
  // 2 BERT blocks per stage: stage 1's layer 7 is block 3's second Linear (the key projection).
  const std::string trace = tmp("pf_trace.json");
  PlanRun r = plan("--kfac --schedule 1f1b --stages 4 --micro-batches 4 --tcurv 3 --tinv 10 --tprec 0.5 --model "
                   "bert-base --layers-per-stage 2 --trace " + trace);
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(slurp(trace));
  int named = 0, key = 0;
  for (const auto& e : j["traceEvents"]) {
    if (!e.contains("args") || !e["args"].contains("layer")) continue;
    ++named;
    ASSERT_TRUE(e["args"].contains("layer_name")) << e.dump();
    if (e["args"]["stage"] == 1 && e["args"]["layer"] == 7) {
      EXPECT_EQ(e["args"]["layer_name"], "bert.encoder.layer.3.attention.self.key");
      ++key;
    }
  }
  EXPECT_GT(named, 0);
  EXPECT_GT(key, 0);
}

TEST(PlanFigures, ReadmeSweepDrawsSeveralPointsAndANonZeroRatio) {
  const std::string csv = tmp("readme_sweep.csv"), svg = tmp("readme_sweep.svg");
  PlanRun r = plan("--sweep --schedule 1f1b --tf 1 --tb 2 --tcurv 1.5 --tinv 6 --tprec 0.5 --csv " + csv + " --svg " + svg);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string s = slurp(svg);
  // The x axis: the depths 4 8 16 32 (one micro-batch size from flags).
  std::set<std::string> xs;
  const std::regex x_label("font-size=\"10\" text-anchor=\"middle\">([0-9]+)</text>");
  for (auto it = std::sregex_iterator(s.begin(), s.end(), x_label); it != std::sregex_iterator(); ++it) xs.insert((*it)[1]);
  EXPECT_EQ(xs, (std::set<std::string>{"4", "8", "16", "32"}));
  EXPECT_EQ(s.find("all 0"), std::string::npos);
  // The ratio column is non-zero in every row (the chart's second panel).
  std::ifstream f(csv);
  std::string line;
  std::getline(f, line);
  int rows = 0;
  while (std::getline(f, line)) {
    std::vector<std::string> c;
    for (size_t p = 0, q; p <= line.size(); p = q + 1) {
      q = line.find(',', p);
      if (q == std::string::npos) q = line.size();
      c.push_back(line.substr(p, q - p));
    }
    EXPECT_GT(std::stod(c[8]), 0) << line;
    ++rows;
  }
  EXPECT_EQ(rows, 12);
}

TEST(PlanFigures, DataParallelWithoutKfacAddsTheGradientAllReduce) {
  // 1F1B D = 4, N = 4, T_f = 1, T_b = 2: (N + D - 1)(T_f + T_b) = 21, then the all-reduce
  // (alpha 5 ms from the profile; grad_bytes 0).
  const std::string prof = tmp("dp_profile.json");
  std::ofstream(prof) << R"({"format": "pipefisher-profile", "version": 1, "micro_batch_size": 4,
    "stages": [{"forward": 1, "backward": 2}], "allreduce": {"alpha": 5, "beta": 0}})";
  PlanRun one = plan("--schedule 1f1b --stages 4 --micro-batches 4 --json --profile " + prof);
  PlanRun two = plan("--schedule 1f1b --stages 4 --micro-batches 4 --data-parallel 2 --json --profile " + prof);
  ASSERT_EQ(one.status, 0) << one.err;
  ASSERT_EQ(two.status, 0) << two.err;
  EXPECT_DOUBLE_EQ(json::parse(one.out)["step_time"].get<double>(), 21);
  EXPECT_DOUBLE_EQ(json::parse(two.out)["step_time"].get<double>(), 26);
  EXPECT_EQ(json::parse(two.out)["data_parallel"], 2);
}

TEST(PlanFigures, MemoryModelIsNonZeroForEveryModel) {
  for (const char* m : {"bert-tiny", "bert-mini", "bert-base", "bert-large", "gpt2-tiny", "gpt2-small"}) {
    PlanRun r = plan(fmt::format("--schedule gpipe --stages 2 --micro-batches 2 --model {} --json", m));
    ASSERT_EQ(r.status, 0) << m << r.err;
    const json mem = json::parse(r.out)["memory"];
    EXPECT_GT(mem["m_pipe"].get<double>(), 0) << m;
    EXPECT_GT(mem["m_kfac"].get<double>(), 0) << m;
  }
  // BERT-Base: a block has 7,087,872 parameters (Hugging Face's bert-base-uncased, per encoder
  // layer); parameters and gradients, 4 bytes each, in MB.
  PlanRun r = plan("--schedule gpipe --stages 2 --micro-batches 2 --model bert-base --json");
  EXPECT_NEAR(json::parse(r.out)["memory"]["params"].get<double>(), 2 * 7087872 * 4 / 1048576.0, 1e-9);
  PlanRun text = plan("--schedule 1f1b --stages 4 --micro-batches 8");
  EXPECT_EQ(text.out.find("M_pipe 0.0 MB"), std::string::npos) << text.out;
}

// A profile as the runtime writes it (hand-made: 1F1B on 2 devices, 4 micro-batches, bert-tiny,
// PipeFisher; two K-FAC layers per stage).
std::string run_profile(const std::string& name, bool with_run) {
  const std::string path = tmp(name);
  json layer = {{"d_in", 128}, {"d_out", 128}, {"curvature_a", 0.4}, {"curvature_b", 0.4},
                {"inversion_a", 2.0}, {"inversion_b", 2.0}, {"diagonal_b", false}};
  json st = {{"forward", 2}, {"backward", 4}, {"optimizer", 0.5}, {"precondition", 0.3}, {"sync", 0},
             {"kfac_layers", {layer, layer}}};
  json j = {{"format", "pipefisher-profile"}, {"version", 1}, {"micro_batch_size", 8}, {"stages", {st, st}},
            {"measured", {{"schedule", "1f1b"}, {"devices", 2}, {"replicas", 1}, {"micro_batches", 4}, {"step_time", 31.0}}}};
  if (with_run)
    j["run"] = {{"schedule", "1f1b"}, {"devices", 2}, {"virtual_stages", 1}, {"micro_batches", 4}, {"replicas", 1},
                {"model", "bert-tiny"}, {"kfac", "bubbles"}};
  std::ofstream(path) << j.dump();
  return path;
}

TEST(PlanFigures, ProfileAloneDescribesItsRun) {
  PlanRun r = plan("--profile " + run_profile("run_profile.json", true) + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["schedule"], "1f1b");
  EXPECT_EQ(j["stages"], 2);
  EXPECT_EQ(j["micro_batches"], 4);
  EXPECT_EQ(j["data_parallel"], 1);
  ASSERT_TRUE(j.contains("kfac")) << r.out;
  EXPECT_EQ(j["kfac"]["model"], "bert-tiny");
  for (const auto& lb : j["kfac"]["lower_bound_refresh_steps"]) EXPECT_GE(lb.get<int>(), 1);
  EXPECT_GT(j["memory"]["m_pipe"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(j["profile_run"]["measured_step_time"].get<double>(), 31.0);
  // (N + D - 1)(T_f + T_b) = 30 without K-FAC; PipeFisher's step is never below it.
  EXPECT_DOUBLE_EQ(j["step_time"].get<double>(), 30);
  EXPECT_GE(j["kfac"]["step_time"].get<double>(), 30);
  // The run's step: PipeFisher's, then each device's optimizer (0.5 ms), as the runtime appends it.
  EXPECT_DOUBLE_EQ(j["predicted_step_time"].get<double>(), j["kfac"]["step_time"].get<double>() + 0.5);

  // W = 2: the replicas and the run's broadcast model come from the file too.
  json w2 = json::parse(slurp(run_profile("run_profile.json", true)));
  w2["run"]["replicas"] = 2;
  w2["broadcast"] = {{"alpha", 3.5}, {"beta", 0}};
  const std::string w2_path = tmp("run_profile_w2.json");
  std::ofstream(w2_path) << w2.dump();
  PlanRun r2 = plan("--profile " + w2_path + " --json");
  ASSERT_EQ(r2.status, 0) << r2.err;
  const json j2 = json::parse(r2.out);
  EXPECT_EQ(j2["data_parallel"], 2);
  EXPECT_EQ(j2["kfac"]["data_parallel"], 2);
  EXPECT_DOUBLE_EQ(j2["kfac"]["bcast_alpha"].get<double>(), 3.5);

  // A run with activation recomputation: its backward times include the re-run forward, so the
  // step is not lengthened again; the memory model keeps one micro-batch's activations per stage.
  json rc = json::parse(slurp(run_profile("run_profile.json", true)));
  rc["run"]["recompute"] = true;
  const std::string rc_path = tmp("run_profile_recompute.json");
  std::ofstream(rc_path) << rc.dump();
  PlanRun r3 = plan("--profile " + rc_path + " --no-kfac --json");
  ASSERT_EQ(r3.status, 0) << r3.err;
  const json j3 = json::parse(r3.out);
  EXPECT_EQ(j3["recompute"], true);
  EXPECT_DOUBLE_EQ(j3["step_time"].get<double>(), 5 * 6 + 0.5);  // (N + D - 1)(T_f + T_b), the optimizer
  PlanRun r4 = plan("--profile " + run_profile("run_profile.json", true) + " --no-kfac --json");
  EXPECT_LT(j3["memory"]["activations"].get<double>(), json::parse(r4.out)["memory"]["activations"].get<double>());

  // Flags override the file; --no-kfac plans it without K-FAC.
  PlanRun o = plan("--profile " + run_profile("run_profile.json", true) + " --micro-batches 8 --no-kfac --json");
  ASSERT_EQ(o.status, 0) << o.err;
  const json jo = json::parse(o.out);
  EXPECT_EQ(jo["micro_batches"], 8);
  EXPECT_EQ(jo["stages"], 2);
  EXPECT_FALSE(jo.contains("kfac"));
  EXPECT_DOUBLE_EQ(jo["step_time"].get<double>(), 9 * 6 + 0.5);  // (N + D - 1)(T_f + T_b), then the optimizer
}

TEST(PlanFigures, OlderProfilesStillLoad) {
  // No "run": the shape comes from "measured" (what the runtime wrote before), no K-FAC flag.
  PlanRun r = plan("--profile " + run_profile("old_profile.json", false) + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["schedule"], "1f1b");
  EXPECT_EQ(j["micro_batches"], 4);
  // Neither: flags as before.
  const std::string bare = tmp("bare_profile.json");
  std::ofstream(bare) << R"({"format": "pipefisher-profile", "version": 1, "micro_batch_size": 4,
    "stages": [{"forward": 1, "backward": 2}]})";
  PlanRun b = plan("--schedule 1f1b --stages 2 --micro-batches 2 --json --profile " + bare);
  ASSERT_EQ(b.status, 0) << b.err;
  expect_usage("--profile " + bare, "pipefisher: --schedule: give either --schedule NAME or --schedule-file FILE");
  const std::string bad = tmp("bad_run_profile.json");
  std::ofstream(bad) << R"({"format": "pipefisher-profile", "version": 1, "micro_batch_size": 4,
    "stages": [{"forward": 1, "backward": 2}], "run": {"schedule": "1f1b", "devices": 0, "micro_batches": 2}})";
  expect_usage("--profile " + bad, "pipefisher: --profile (" + bad + "): 'run.devices' must be an integer");
  const std::string empty = tmp("empty_units_profile.json");
  std::ofstream(empty) << R"({"format": "pipefisher-profile", "version": 1, "micro_batch_size": 4,
    "stages": [{"forward": 1, "backward": 2, "kfac_layers": []}]})";
  expect_usage("--schedule 1f1b --stages 2 --micro-batches 2 --profile " + empty,
               "pipefisher: --profile (" + empty + "): 'stages[0].kfac_layers' must be a non-empty array");
}

// bench/paper_figures.sh regenerates bench/paper_figures.md byte for byte (the planner's numbers on
// the paper's own profiles: no timing, any machine), and says on stderr which figure it computes.
TEST(PlanFigures, PaperFiguresScriptReproducesItsMarkdownAndSaysWhatItComputes) {
  const std::string build = std::filesystem::path(PF_BINARY).parent_path().string();
  const std::string out = tmp("paper_figures.md"), err = tmp("paper_figures.err");
  const int rc = std::system(("bash " PF_SOURCE_DIR "/bench/paper_figures.sh " + build + " > " + out + " 2> " + err).c_str());
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << slurp(err);
  EXPECT_TRUE(slurp(out) == slurp(PF_SOURCE_DIR "/bench/paper_figures.md")) << "bench/paper_figures.md is stale";
  const std::string said = slurp(err);
  for (const char* what : {"planning Fig. 3 GPipe BERT-Base D=N=4", "planning Fig. 4 Chimera BERT-Large D=N=8",
                           "planning Fig. 7 Chimera BERT-Base D=N=4", "sweeping bert-base_p100 (Figures 5, 6, 9-16)",
                           "sweeping bert-large_p100 with and without recomputation"})
    EXPECT_NE(said.find(std::string("bench/paper_figures.sh: ") + what), std::string::npos) << what << "\n" << said;
}

}  // namespace
