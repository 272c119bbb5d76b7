// Recorded profiles: a run's profile.json and kfac_profile.json, planning from one
// (kfac.plan_profile, `plan --profile`), and refusing a bad one.
#include "pipefisher_fixture.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using namespace pf_test::pipefisher;

namespace {

std::vector<double> losses(const fs::path& log) {
  std::vector<double> out;
  std::ifstream f(log);
  for (std::string line; std::getline(f, line);) out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  return out;
}

// The plan's line from "refresh every" to its end: refresh periods, splits, predicted times.
std::string plan_line(const std::string& out) {
  const size_t at = out.find("pipefisher: planned from");
  if (at == std::string::npos) return "";
  const size_t from = out.find("refresh every", at);
  return out.substr(from, out.find('\n', from) - from);
}

// The run's "outputs:" line names every file it wrote into out_dir (not its lock), and everything it names exists
// (out_dir/{a, b}, then paths elsewhere; a trailing '/' names a directory).
void expect_outputs_line_complete(const std::string& out, const fs::path& out_dir) {
  const size_t at = out.find("outputs: ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string line = out.substr(at, out.find('\n', at) - at);
  const size_t open = line.find('{'), close = line.find('}');
  ASSERT_EQ(line.substr(9, open - 9), out_dir.string() + "/") << line;
  std::set<std::string> named;
  std::stringstream in_dir(line.substr(open + 1, close - open - 1));
  for (std::string n; std::getline(in_dir, n, ',');) named.insert(n.substr(n.find_first_not_of(' ')));
  for (const std::string& n : named) EXPECT_TRUE(fs::is_regular_file(out_dir / n)) << n << " in " << line;
  for (const auto& e : fs::directory_iterator(out_dir))
    if (e.is_regular_file() && e.path().filename().string()[0] != '.')  // not the run's lock
      EXPECT_TRUE(named.count(e.path().filename().string())) << e.path() << " not in " << line;
  std::stringstream elsewhere(line.substr(close + 1));
  for (std::string n; std::getline(elsewhere, n, ',');)
    if (n.find_first_not_of(' ') != std::string::npos) {
      n = n.substr(n.find_first_not_of(' '));
      EXPECT_TRUE(n.back() == '/' ? fs::is_directory(n) : fs::is_regular_file(n)) << n << " in " << line;
    }
}

}  // namespace

// kfac.plan_profile: a run plans from the profile another run recorded (out_dir/kfac_profile.json)
// instead of its own timings, so two runs refresh the same way and give the same losses and
// weights bit for bit (deterministic mode, the same layout and threads). The test hook scales
// K-FAC's costs 2x in every run so that the plan refreshes over several steps and splits some
// inversions (a plan from timings would then vary with the machine's load).
TEST(PipeFisherRuntime, PlanProfileGivesTheSameLossesOnEveryRun) {
  const std::string sets = "--set parallel.stages=2 --set parallel.schedule=1f1b --set kfac.placement=bubbles "
                           "--set train.steps=10";
  const std::string scale = "--test-kfac-cost-scale 2";
  // The recording run keeps its first plan (a re-plan on drift, under load, would record the
  // second one's profile while its output's first plan line is the first one's).
  Launched rec = launch(2, "pp_record", sets + " --set kfac.replan_on_drift=false --profile-dir " +
                                            (dir() / "pp_profile").string() + " --profile-steps 4",
                        scale);
  ASSERT_EQ(rec.status, 0) << rec.out;
  const fs::path profile = dir() / "pp_record" / "kfac_profile.json";
  ASSERT_TRUE(fs::exists(profile)) << rec.out;
  const nlohmann::json recorded = read_json(profile);
  // --profile-dir's profile.json carries the same record (either file can be named): the same
  // action times and shape, the same K-FAC units and broadcast model.
  EXPECT_EQ(read_json(dir() / "pp_profile" / "profile.json")["pipefisher_plan"], recorded["pipefisher_plan"]);
  EXPECT_TRUE(pf::read_profile_json((dir() / "pp_profile" / "profile.json").string()).plan ==
              pf::read_profile_json(profile.string()).plan);
  // The record is a profile `plan --profile` reads, with the run's shape.
  Launched planned = pf_test::run(std::string(PF_BINARY) + " plan --json --profile " + profile.string());
  ASSERT_EQ(planned.status, 0) << planned.out;
  const nlohmann::json pj = nlohmann::json::parse(planned.out.substr(planned.out.find('{')));
  EXPECT_EQ(pj["schedule"], "1f1b");
  EXPECT_EQ(pj["stages"], 2);
  EXPECT_TRUE(pj.contains("kfac")) << planned.out;
  const std::string with = sets + " --set kfac.plan_profile=" + profile.string();
  Launched a = launch(2, "pp_a", with, scale);
  Launched b = launch(2, "pp_b", with, scale);
  ASSERT_EQ(a.status, 0) << a.out;
  ASSERT_EQ(b.status, 0) << b.out;
  for (const Launched* r : {&a, &b}) {
    EXPECT_NE(r->out.find("pipefisher: planned from kfac.plan_profile = " + profile.string()), std::string::npos) << r->out;
    EXPECT_EQ(plan_line(r->out), plan_line(rec.out)) << r->out;  // the recording run's plan, from its numbers
  }
  EXPECT_EQ(read_json(dir() / "pp_a" / "kfac_profile.json")["pipefisher_plan"], recorded["pipefisher_plan"]);
  EXPECT_EQ(read_json(dir() / "pp_a" / "kfac_profile.json"), recorded);  // the whole record, K-FAC units included
  // The same refresh pattern, with inverses used after the step that built them (a plan, not inline).
  const nlohmann::json ra = read_json(dir() / "pp_a" / "kfac_refresh.json");
  EXPECT_EQ(ra, read_json(dir() / "pp_b" / "kfac_refresh.json"));
  int stale = 0;
  for (const auto& e : ra["events"]) stale += e["use_step"].get<int64_t>() > e["curv_step"].get<int64_t>();
  EXPECT_GT(stale, 0) << ra.dump(1);
  // The same losses and weights, bit for bit.
  const std::vector<double> la = losses(dir() / "pp_a" / "log.jsonl");
  ASSERT_EQ(la.size(), 10u);
  EXPECT_EQ(la, losses(dir() / "pp_b" / "log.jsonl"));
  const auto wa = saved_weights(dir() / "pp_a.safetensors");
  EXPECT_GT(wa.size(), 20u);
  EXPECT_TRUE(wa == saved_weights(dir() / "pp_b.safetensors"));
}

// --profile-dir of a 2-rank PipeFisher run (issue 15): profile.json carries the run's shape and
// its K-FAC units, so `plan --profile` with no other flag predicts that run; trace.json holds
// every profiled step, marked, with K-FAC units named as the model names its layers.
TEST(PipeFisherRuntime, ProfileCarriesTheRunAndTheTraceNamesTheLayers) {
  const fs::path pdir = dir() / "pr_profile";
  fs::remove_all(pdir);
  Launched r = launch(2, "pr_run", "--set parallel.stages=2 --set parallel.schedule=1f1b --set kfac.placement=bubbles "
                                   "--set train.steps=8 --set kfac.replan_on_drift=false --profile-dir " +
                                       pdir.string() + " --profile-steps 2,7,8");
  ASSERT_EQ(r.status, 0) << r.out;
  expect_outputs_line_complete(r.out, dir() / "pr_run");
  EXPECT_NE(r.out.find(", " + pdir.string() + "/"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", " + (dir() / "pr_run" / "checkpoints").string() + "/"), std::string::npos) << r.out;
  const nlohmann::json prof = read_json(pdir / "profile.json");
  const nlohmann::json& run = prof["run"];
  EXPECT_EQ(run["schedule"], "1f1b");
  EXPECT_EQ(run["devices"], 2);
  EXPECT_EQ(run["micro_batches"], 4);
  EXPECT_EQ(run["replicas"], 1);
  EXPECT_EQ(run["kfac"], "bubbles");
  EXPECT_EQ(run["recompute"], false);
  // The layer names are the model's: each is a weight of the saved checkpoint.
  const auto weights = saved_weights(dir() / "pr_run.safetensors");
  std::set<std::string> names;
  for (const auto& st : prof["stages"]) {
    ASSERT_TRUE(st.contains("kfac_layers")) << st.dump();
    EXPECT_GE(st["kfac_layers"].size(), 6u);  // 2 blocks x 6 Linears (+ the head's on the last stage)
    EXPECT_GT(st["mem_param"].get<double>(), 0);
    for (const auto& l : st["kfac_layers"]) {
      const std::string n = l["name"];
      EXPECT_TRUE(weights.count(n + ".weight")) << n;
      names.insert(n);
      EXPECT_GT(l["inversion_a"].get<double>(), 0) << n;
    }
  }
  // One trace for the run: the three steps marked, K-FAC units named by those layers.
  EXPECT_FALSE(fs::exists(pdir / "trace-step7.json"));
  const nlohmann::json trace = read_json(pdir / "trace.json");
  std::set<int> steps;
  int named = 0;
  std::map<std::string, int> profiling_step;  // step 2 (inline, profiling): its K-FAC units by kind
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("cat", "") == "step" && e["ph"] == "X") steps.insert(e["args"]["step"].get<int>());
    if (e["ph"] == "X" && e.contains("args") && e["args"].value("step", 0) == 2) ++profiling_step[e.value("cat", "")];
    if (e.contains("args") && e["args"].contains("layer_name")) {
      EXPECT_TRUE(names.count(e["args"]["layer_name"].get<std::string>())) << e.dump();
      EXPECT_NE(e["name"].get<std::string>().find(e["args"]["layer_name"].get<std::string>()), std::string::npos);
      ++named;
    }
  }
  EXPECT_EQ(steps, (std::set<int>{2, 7, 8}));
  // The inline refresh of a profiling step as its units, not one precondition block: every layer's
  // curvature and inversions, then one precondition per stage.
  EXPECT_GE(profiling_step["curvature A"], 12) << trace.dump().substr(0, 2000);
  EXPECT_GE(profiling_step["inversion A"], 12);
  EXPECT_GE(profiling_step["inversion B"], 12);
  EXPECT_EQ(profiling_step["precondition"], 2);
  EXPECT_GT(named, 0);  // steps 7 and 8 run the plan's K-FAC units

  // plan --profile alone: the run's shape, K-FAC, a lower bound, memory.
  Launched p = pf_test::run(std::string(PF_BINARY) + " plan --json --profile " + (pdir / "profile.json").string());
  ASSERT_EQ(p.status, 0) << p.out;
  const nlohmann::json j = nlohmann::json::parse(p.out.substr(p.out.find('{')));
  EXPECT_EQ(j["schedule"], "1f1b");
  EXPECT_EQ(j["stages"], 2);
  EXPECT_EQ(j["micro_batches"], 4);
  EXPECT_EQ(j["data_parallel"], 1);
  ASSERT_TRUE(j.contains("kfac")) << p.out;
  for (const auto& lb : j["kfac"]["lower_bound_refresh_steps"]) EXPECT_GE(lb.get<int>(), 1) << p.out;
  EXPECT_GT(j["memory"]["m_pipe"].get<double>(), 0);
  // The machine is shared: the prediction only within a factor of 3 of the measured mean step.
  const double measured = prof["measured"]["step_time"].get<double>(), predicted = j["predicted_step_time"].get<double>();
  std::printf("[ profile ] measured step %.3f ms, plan --profile predicts %.3f ms with PipeFisher\n", measured, predicted);
  EXPECT_GT(predicted, measured / 3);
  EXPECT_LT(predicted, measured * 3);
}

// A missing, malformed or foreign recorded profile exits 2 naming kfac.plan_profile before any
// output is written.
TEST(PipeFisherRuntime, BadPlanProfileIsRefusedNamingTheKey) {
  const std::string sets = "--set parallel.stages=2 --set parallel.schedule=1f1b --set kfac.placement=bubbles "
                           "--set train.steps=3";
  const fs::path garbage = dir() / "garbage.json", other = dir() / "no_plan.json", gpipe = dir() / "gpipe_plan.json";
  std::ofstream(garbage) << "not json";
  std::ofstream(other) << R"({"format": "pipefisher-profile"})";
  Launched rec = launch(2, "pp_gpipe", "--set parallel.stages=2 --set parallel.schedule=gpipe "
                                       "--set kfac.placement=bubbles --set train.steps=3");
  ASSERT_EQ(rec.status, 0) << rec.out;
  fs::copy_file(dir() / "pp_gpipe" / "kfac_profile.json", gpipe, fs::copy_options::overwrite_existing);
  struct Case {
    std::string name, sets, says;
  };
  for (const Case& c : {Case{"pp_missing", sets + " --set kfac.plan_profile=" + (dir() / "absent.json").string(), "no such file"},
                        Case{"pp_garbage", sets + " --set kfac.plan_profile=" + garbage.string(), "is not JSON"},
                        Case{"pp_no_plan", sets + " --set kfac.plan_profile=" + other.string(), "no \"pipefisher_plan\""},
                        Case{"pp_foreign", sets + " --set kfac.plan_profile=" + gpipe.string(), "was recorded for"},
                        Case{"pp_inline", sets + " --set kfac.placement=inline --set kfac.plan_profile=" + gpipe.string(),
                             "only applies with"}}) {
    fs::remove_all(dir() / c.name);
    Launched r = launch(2, c.name, c.sets);
    EXPECT_EQ(r.status, 2) << c.name << ": " << r.out;
    EXPECT_NE(r.out.find("kfac.plan_profile: "), std::string::npos) << c.name << ": " << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.name << ": " << r.out;
    EXPECT_FALSE(fs::exists(dir() / c.name / "log.jsonl")) << c.name;
  }
}
