// `pipefisher report --account`: PipeFisher's measured step against NVLAMB's, from two real 2-rank
// bert-tiny runs' --profile-dirs. Every check is a relation that holds whatever the timings are,
// each recomputed here from the raw events of trace.json by this file's own reading of them:
// the parts sum to the measured difference; the critical path tiles the step with stretches of
// real events, filed under the part of their kind; a unit's overrun is its end minus its
// bubble's end when positive.
#include "../support/launch.hpp"
#include "../support/scratch.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <tuple>
#include <vector>

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path dir() { return pf_test::scratch_dir("step_account_cli"); }

constexpr double kTol = 1e-6;  // ms: JSON round trips and sums of a few hundred doubles

constexpr const char* kConfig =
    "[model]\npreset = \"bert-tiny\"\nseq_len = 32\n"
    "[data]\nvocab = \"bert\"\ntrain_file = \"" PF_SOURCE_DIR "/data/sample/moby-dick-1-20.bert.bin\"\n"
    "valid_file = \"" PF_SOURCE_DIR "/data/sample/moby-dick-1-20.bert.bin\"\n"
    "[optim]\nname = \"nvlamb\"\nlr = 5e-3\nwarmup_steps = 1\n"
    "[train]\nsteps = 6\nthreads = 1\neval_every = 0\neval_batches = 1\n"
    "[parallel]\nstages = 2\nschedule = \"1f1b\"\nmicro_batches = 4\nmicro_batch_size = 2\n";

// One 2-rank run profiled at steps 2 (PipeFisher: inline, profiling) and 4-6 (planned).
fs::path profiled_run(const std::string& name, const std::string& sets) {
  const fs::path cfg = dir() / "tiny.toml", out = dir() / name;
  std::ofstream(cfg) << kConfig;
  fs::remove_all(out);
  const pf_test::Launch r = pf_test::run("OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 " PF_SOURCE_DIR "/scripts/pfrun -np 2 " PF_BINARY
                                         " train --config " + cfg.string() + " --set train.out_dir=" + out.string() +
                                         " --profile-dir " + (out / "profile").string() + " --profile-steps 2,4,5,6 " + sets);
  EXPECT_EQ(r.status, 0) << r.out;
  return out / "profile";
}

// trace.json read here: per step, per rank, the events in file order (list order), ms from the step's start.
struct Event {
  std::string action, kind;
  double start = 0, end = 0;
  json planned_start, planned_end;
  double taps = 0;  // args.kfac_taps_ms: the pass's time in K-FAC's taps
};
struct Step {
  double time = 0;
  std::vector<std::vector<Event>> ranks = std::vector<std::vector<Event>>(2);
};

std::map<int, Step> read_trace(const fs::path& profile) {
  const json t = json::parse(std::ifstream(profile / "trace.json"));
  std::map<int, double> start;
  for (const json& e : t["traceEvents"])
    if (e.value("cat", "") == "step" && e["ph"] == "X") start[e["args"]["step"].get<int>()] = e["ts"].get<double>();
  std::map<int, Step> steps;
  for (const json& e : t["traceEvents"]) {
    if (e["ph"] != "X" || e.value("cat", "") == "step") continue;
    const json& a = e["args"];
    const int k = a["step"].get<int>();
    Event ev{.action = a["action"].get<std::string>(), .kind = "",
             .start = (e["ts"].get<double>() - start.at(k)) / 1000,
             .end = (e["ts"].get<double>() + e["dur"].get<double>() - start.at(k)) / 1000,
             .planned_start = a.value("planned_start", json()), .planned_end = a.value("planned_end", json()),
             .taps = a.value("kfac_taps_ms", 0.0)};
    std::smatch m;
    std::regex_search(ev.action, m, std::regex("^[0-9]+([A-Z_]+)"));
    ev.kind = m[1];
    steps[k].ranks.at(e["pid"].get<size_t>()).push_back(ev);
    steps[k].time = std::max(steps[k].time, ev.end);
  }
  return steps;
}

bool is_unit(const std::string& k) { return k.rfind("CURV_", 0) == 0 || k.rfind("INV_", 0) == 0 || k == "SYNC_CURV" || k.rfind("BCAST_INV", 0) == 0; }

std::string part_of(const std::string& k) {
  if (k == "F") return "forward passes";
  if (k == "B" || k == "I" || k == "W") return "backward passes";
  if (k == "OPT") return "optimizer";
  if (k == "PREC") return "precondition";
  if (k.rfind("CURV_", 0) == 0) return "curvature overrun";
  if (k.rfind("INV_", 0) == 0) return "inversion overrun";
  if (k == "SYNC_CURV" || k.rfind("BCAST_INV", 0) == 0) return "sync/broadcast overrun";
  return "send/receive";
}

const Event* find(const Step& s, int rank, const std::string& action) {
  for (const Event& e : s.ranks.at(rank))
    if (e.action == action) return &e;
  return nullptr;
}

// The bubble's end of unit i of `rank`, by the rule docs/plan-and-report.md states.
double bubble_end(const Step& s, int rank, int i) {
  const std::vector<Event>& row = s.ranks[rank];
  int p = i - 1, n = i + 1;
  while (p >= 0 && is_unit(row[p].kind)) --p;
  while (n < static_cast<int>(row.size()) && is_unit(row[n].kind)) ++n;
  const double own = p >= 0 ? row[p].end : 0;
  if (n >= static_cast<int>(row.size())) return own;
  const std::string& next = row[n].kind;
  if (next == "RECV_F" || next == "RECV_B") {  // "1RECV_F2" waits for "0SEND_F2", "0RECV_B2" for "1SEND_B2"
    std::smatch m;
    std::regex_match(row[n].action, m, std::regex("([0-9]+)RECV_([FB])(.*)"));
    const int stage = std::stoi(m[1]) + (m[2] == "F" ? -1 : 1);
    const Event* send = find(s, 1 - rank, std::to_string(stage) + "SEND_" + std::string(m[2]) + std::string(m[3]));
    return send ? std::max(own, send->end) : own;
  }
  const auto first_opt = [&](int r) {
    return std::find_if(s.ranks[r].begin(), s.ranks[r].end(), [](const Event& e) { return e.kind == "OPT"; }) - s.ranks[r].begin();
  };
  if (next == "OPT" && first_opt(rank) == n) {
    const auto f = first_opt(1 - rank);
    return std::max(own, f > 0 ? s.ranks[1 - rank][f - 1].end : 0.0);
  }
  return own;
}

// The path tiles [0, step] with stretches of real events (or stretches where the rank ran
// nothing), each filed under its kind's part; returns the sums per part, a pass's stretch giving
// its taps' fraction of the pass to "K-FAC taps in passes".
std::map<std::string, double> check_path(const json& path, const Step& s, double step_ms) {
  std::map<std::string, double> sums;
  double t = 0;
  for (const json& p : path) {
    const double a = p["start_ms"], b = p["end_ms"];
    const int rank = p["rank"];
    EXPECT_NEAR(a, t, kTol) << p.dump();
    EXPECT_GE(b, a - kTol) << p.dump();
    t = b;
    sums[p["part"].get<std::string>()] += b - a;
    if (p["action"].is_null()) {  // the rank ran nothing in that stretch
      EXPECT_EQ(p["part"], "other (between actions)");
      for (const Event& e : s.ranks.at(rank)) EXPECT_FALSE(e.start < b - kTol && e.end > a + kTol) << p.dump() << e.action;
      continue;
    }
    if (p["index"].get<size_t>() >= s.ranks.at(rank).size()) {
      ADD_FAILURE() << "no such action: " << p.dump();
      continue;
    }
    const Event* e = &s.ranks[rank][p["index"].get<size_t>()];
    const double taps = e->taps > 0 ? e->taps / (e->end - e->start) * (b - a) : 0;
    sums[p["part"].get<std::string>()] -= taps;
    sums["K-FAC taps in passes"] += taps;
    EXPECT_EQ(e->action, p["action"]) << p.dump();
    EXPECT_EQ(p["part"], part_of(e->kind)) << p.dump();
    // Within its event, or (the first OPT) within the wait drawn before it, after the rank's previous action.
    EXPECT_LE(b, e->end + kTol) << p.dump();
    if (e->kind != "OPT") EXPECT_GE(a, e->start - kTol) << p.dump();
  }
  EXPECT_NEAR(t, step_ms, kTol);
  return sums;
}

void check_units(const json& units, const Step& s, bool planned) {
  // Every unit of the trace, in rank then list order.
  std::vector<std::pair<int, int>> expected;
  for (int r = 0; r < 2; ++r)
    for (size_t i = 0; i < s.ranks[r].size(); ++i)
      if (is_unit(s.ranks[r][i].kind)) expected.push_back({r, static_cast<int>(i)});
  ASSERT_EQ(units.size(), expected.size());
  ASSERT_FALSE(units.empty());
  for (size_t k = 0; k < units.size(); ++k) {
    const json& u = units[k];
    const int rank = u["rank"];
    ASSERT_EQ(std::pair(rank, u["index"].get<int>()), expected[k]) << u.dump();
    const std::vector<Event>& row = s.ranks.at(rank);
    const auto it = row.begin() + expected[k].second;
    EXPECT_EQ(it->action, u["action"]) << u.dump();
    EXPECT_NEAR(u["measured_ms"].get<double>(), it->end - it->start, kTol);
    EXPECT_NEAR(u["end_ms"].get<double>(), it->end, kTol);
    const double bubble = bubble_end(s, rank, static_cast<int>(it - row.begin()));
    EXPECT_NEAR(u["bubble_end_ms"].get<double>(), bubble, kTol) << u.dump();
    EXPECT_NEAR(u["overrun_ms"].get<double>(), std::max(0.0, it->end - bubble), kTol) << u.dump();
    EXPECT_EQ(u["delayed"].is_null(), u["overrun_ms"].get<double>() == 0) << u.dump();
    EXPECT_EQ(u["planned_ms"].is_null(), !planned) << u.dump();
    if (planned) {
      EXPECT_NEAR(u["planned_ms"].get<double>(), it->planned_end.get<double>() - it->planned_start.get<double>(), kTol);
      EXPECT_GT(u["planned_ms"].get<double>(), 0) << u.dump();
    }
  }
}

// The time of a kind's actions without their taps.
double kind_time(const std::vector<Event>& row, const std::string& kind) {
  double t = 0;
  for (const Event& e : row) t += e.kind == kind ? e.end - e.start - e.taps : 0;
  return t;
}

double taps_time(const std::vector<Event>& row) {
  double t = 0;
  for (const Event& e : row) {
    EXPECT_GE(e.taps, 0) << e.action;
    EXPECT_LE(e.taps, e.end - e.start + kTol) << e.action;
    t += e.taps;
  }
  return t;
}

// A pass's setting by the rule step_account.hpp states: right after a unit of its rank (sends
// and receives skipped), else beside another rank's units for at least half its time, else alone.
std::string setting_of(const Step& s, int rank, size_t i) {
  const std::vector<Event>& row = s.ranks.at(rank);
  for (size_t k = i; k-- > 0;) {
    if (part_of(row[k].kind) == "send/receive") continue;
    if (is_unit(row[k].kind)) return "after a unit";
    break;
  }
  double beside = 0;
  for (const Event& u : s.ranks.at(1 - rank))
    if (is_unit(u.kind)) beside += std::max(0.0, std::min(row[i].end, u.end) - std::max(row[i].start, u.start));
  return 2 * beside >= row[i].end - row[i].start ? "beside a unit" : "alone";
}

// Per setting: the passes' count, time, and the same passes' time in the baseline, without taps.
void check_settings(const json& settings, const Step& s, const Step& base, int rank) {
  std::map<std::string, std::tuple<int, double, double>> want;
  for (size_t i = 0; i < s.ranks.at(rank).size(); ++i) {
    const Event& e = s.ranks[rank][i];
    if (e.kind != "F" && e.kind != "B") continue;
    const Event* b = find(base, rank, e.action);
    ASSERT_NE(b, nullptr) << e.action;
    auto& [n, ms, base_ms] = want[setting_of(s, rank, i)];
    ++n;
    ms += e.end - e.start - e.taps;
    base_ms += b->end - b->start - b->taps;
  }
  ASSERT_EQ(settings.size(), 3u);
  int passes = 0;
  for (const json& g : settings) {
    const auto [n, ms, base_ms] = want[g["setting"].get<std::string>()];
    EXPECT_EQ(g["passes"].get<int>(), n) << g.dump();
    EXPECT_NEAR(g["ms"].get<double>(), ms, kTol) << g.dump();
    EXPECT_NEAR(g["baseline_ms"].get<double>(), base_ms, kTol) << g.dump();
    passes += n;
  }
  EXPECT_EQ(passes, 8);  // 4 micro-batches, forward and backward
}

// Returns the taps' time of both ranks.
double check_passes(const json& passes, const Step& s, const Step& base) {
  EXPECT_EQ(passes.size(), 2u);
  double taps = 0;
  for (const json& p : passes) {
    const int r = p["rank"];
    check_settings(p["by_setting"], s, base, r);
    EXPECT_NEAR(p["forward_ms"].get<double>(), kind_time(s.ranks.at(r), "F"), kTol);
    EXPECT_NEAR(p["backward_ms"].get<double>(), kind_time(s.ranks.at(r), "B"), kTol);  // 1F1B: no split backward
    EXPECT_NEAR(p["baseline_forward_ms"].get<double>(), kind_time(base.ranks.at(r), "F"), kTol);
    EXPECT_NEAR(p["baseline_backward_ms"].get<double>(), kind_time(base.ranks.at(r), "B"), kTol);
    EXPECT_NEAR(p["taps_ms"].get<double>(), taps_time(s.ranks.at(r)), kTol);
    EXPECT_EQ(p["baseline_taps_ms"].get<double>(), 0);  // NVLAMB has no taps
    EXPECT_EQ(taps_time(base.ranks.at(r)), 0);
    taps += p["taps_ms"].get<double>();
  }
  return taps;
}

TEST(StepAccountCli, PartsSumToTheMeasuredDifferenceAndMatchTheRawEvents) {
  const fs::path pf = profiled_run("pf", "--set kfac.enabled=true --set kfac.placement=bubbles --set kfac.replan_on_drift=false");
  const fs::path nv = profiled_run("nvlamb", "");
  const pf_test::Launch r = pf_test::run(std::string(PF_BINARY) + " report --json --account " + pf.string() +
                                         " --baseline " + nv.string());
  ASSERT_EQ(r.status, 0) << r.out;
  const json j = json::parse(r.out);
  const std::map<int, Step> pf_trace = read_trace(pf), nv_trace = read_trace(nv);
  ASSERT_EQ(j["steps"].size(), 4u) << r.out.substr(0, 2000);
  double taps = 0;
  for (const json& st : j["steps"]) {
    const int k = st["step"];
    SCOPED_TRACE("step " + std::to_string(k));
    const Step &s = pf_trace.at(k), &base = nv_trace.at(st["baseline_step"].get<int>());
    EXPECT_NEAR(st["step_ms"].get<double>(), s.time, kTol);
    EXPECT_NEAR(st["baseline_step_ms"].get<double>(), base.time, kTol);
    EXPECT_NEAR(st["difference_ms"].get<double>(), s.time - base.time, kTol);
    // The identity: the parts' differences sum to the measured difference, and each run's parts to its step.
    double diff = 0, sum = 0, base_sum = 0;
    std::map<std::string, double> pf_parts, nv_parts;
    for (const json& p : st["parts"]) {
      diff += p["difference_ms"].get<double>();
      sum += p["pipefisher_ms"].get<double>();
      base_sum += p["baseline_ms"].get<double>();
      pf_parts[p["part"].get<std::string>()] = p["pipefisher_ms"].get<double>();
      nv_parts[p["part"].get<std::string>()] = p["baseline_ms"].get<double>();
    }
    EXPECT_NEAR(diff, s.time - base.time, kTol);
    EXPECT_NEAR(sum, s.time, kTol);
    EXPECT_NEAR(base_sum, base.time, kTol);
    // Each part: the stretches of the critical path filed under it, checked against the events.
    const std::map<std::string, double> path = check_path(st["critical_path"], s, s.time);
    const std::map<std::string, double> base_path = check_path(st["baseline_critical_path"], base, base.time);
    for (const auto& [part, ms] : pf_parts) EXPECT_NEAR(ms, path.count(part) ? path.at(part) : 0.0, kTol) << part;
    for (const auto& [part, ms] : nv_parts) EXPECT_NEAR(ms, base_path.count(part) ? base_path.at(part) : 0.0, kTol) << part;
    for (const char* kfac : {"K-FAC taps in passes", "precondition", "curvature overrun", "inversion overrun",
                             "sync/broadcast overrun"})
      EXPECT_EQ(nv_parts.at(kfac), 0) << kfac;
    // Units: planned times from step 3 on (steps 1-2 profile K-FAC inline); overruns from the events.
    check_units(st["units"], s, k > 2);
    taps += check_passes(st["passes"], s, base);
    double prec_on_path = 0;
    for (const json& p : st["preconditions"]) prec_on_path += p["on_critical_path_ms"].get<double>();
    EXPECT_EQ(st["preconditions"].size(), 2u);  // one per stage
    EXPECT_NEAR(prec_on_path, pf_parts.at("precondition"), kTol);
  }
  // The profiling step and each cycle's first step copy the layers' inputs and gradients: taps.
  EXPECT_GT(taps, 0);
  // The text form: one table per step and the mean, whose rows sum to its difference.
  const pf_test::Launch text = pf_test::run(std::string(PF_BINARY) + " report --account " + pf.string() +
                                            " --baseline " + nv.string());
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_NE(text.out.find("mean over the 4 steps"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("step (the sum)"), std::string::npos) << text.out;
  std::printf("%s", text.out.c_str());

  // Refused, naming the flag: a baseline missing, or runs with no profiled step in common.
  const pf_test::Launch alone = pf_test::run(std::string(PF_BINARY) + " report --account " + pf.string());
  EXPECT_EQ(alone.status, 2) << alone.out;
  EXPECT_NE(alone.out.find("--baseline"), std::string::npos) << alone.out;
  const pf_test::Launch no_dir = pf_test::run(std::string(PF_BINARY) + " report --account " + (dir() / "none").string() +
                                              " --baseline " + nv.string());
  EXPECT_EQ(no_dir.status, 2) << no_dir.out;
  EXPECT_NE(no_dir.out.find("--account"), std::string::npos) << no_dir.out;
}

// The planner gets each pass at its kind's median on its device (a profiled step's first forward
// runs long: bench/RESULTS.md): in every planned step, the plan gives each rank's forwards one
// duration and its backwards another (they were the profiled steps' means, each its own).
TEST(StepAccountCli, ThePlanGivesEveryPassOfAKindItsMedian) {
  const fs::path pf = profiled_run("pf_median", "--set kfac.enabled=true --set kfac.placement=bubbles "
                                                "--set kfac.replan_on_drift=false");
  const std::map<int, Step> trace = read_trace(pf);
  int planned_steps = 0;
  for (const auto& [k, s] : trace) {
    if (k <= 2) continue;  // steps 1-2 profile K-FAC inline: no plan
    ++planned_steps;
    for (size_t r = 0; r < s.ranks.size(); ++r) {
      std::map<std::string, std::vector<double>> planned;  // kind -> planned durations
      for (const Event& e : s.ranks[r])
        if ((e.kind == "F" || e.kind == "B") && e.planned_start.is_number())
          planned[e.kind].push_back(e.planned_end.get<double>() - e.planned_start.get<double>());
      for (const char* kind : {"F", "B"}) {
        ASSERT_EQ(planned[kind].size(), 4u) << "step " << k << " rank " << r << " " << kind;  // 4 micro-batches
        for (double d : planned[kind])  // the same double, shifted by the plan's clock: a few ulps
          EXPECT_NEAR(d, planned[kind].front(), 1e-9 * (1 + planned[kind].front()))
              << "step " << k << " rank " << r << " " << kind;
      }
    }
  }
  EXPECT_EQ(planned_steps, 3);  // steps 4-6
}

}  // namespace
