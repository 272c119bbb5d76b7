// SOAP's statistics (STAT, one step late) and eigenbasis refreshes in the pipeline's bubbles
// (optim.name = soap, kfac.placement = bubbles: runtime/soap/soap_placement.hpp) under real mpirun, 1 thread per rank, on the tests'
// tiny BERT: the run plans the refreshes into the bubbles (1F1B, zero-bubble H1 and V) and records
// each one it ran (soap_refresh.json); one process following that record (kfac.placement =
// replay) trains the same weights to rounding, and the same layout following it the same bits.
//
// Across layouts: the pipeline sums the gradients in another order than one process (per stage),
// so the statistics and bases differ by float32 rounding, which SOAP's updates carry into the
// weights: 1e-6 on weights of ~0.02-1, as tests/runtime/test_runtime.cpp allows the layouts, with
// optim.eps = 1 as there (measured after 8 steps: 4e-9). A smaller eps lets a nearly repeated
// eigenvalue turn that rounding into much more (eps = 0.01: 8e-5 on this plan; docs/optimizers.md),
// and at eps = 1 the update is nearly the unrotated momentum whichever the basis (no refresh at
// all: 3e-7), so across layouts the refresh pattern is not told apart from rounding. On the
// recording run's layout it is: the record followed gives the same bits, a record one step off
// does not (OneF1B_2x1_TheRecordFollowedOnItsLayoutIsTheSameBits).
#include "../support/launch.hpp"
#include "../support/scratch.hpp"
#include "../support/weights.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using pf_test::run;

const std::string kEnv = "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ";
const std::string kPfrun = PF_SOURCE_DIR "/scripts/pfrun";

fs::path work_dir() { return pf_test::scratch_dir("soap_bubbles_test"); }

// The runtime tests' tiny BERT, 8 steps of SOAP with a refresh every 2 steps.
fs::path tiny_config() {
  fs::path p = work_dir() / "tiny.toml";
  if (!fs::exists(p)) {
    std::ofstream f(p);
    f << "[model]\narch = \"bert\"\nlayers = 4\nhidden = 32\nheads = 2\nffn = 64\nseq_len = 16\nmax_position = 16\n"
      << "[data]\nvocab = \"bert\"\ntrain_file = \"" PF_SOURCE_DIR "/data/sample/moby-dick-1-20.bert.bin\"\n"
      << "valid_file = \"" PF_SOURCE_DIR "/data/sample/moby-dick-1-20.bert.bin\"\n"
      << "[optim]\nname = \"soap\"\nlr = 1e-2\nwarmup_steps = 1\neps = 1.0\n"
      << "[optim.soap]\nprecondition_frequency = 2\n"
      << "[train]\nsteps = 8\nthreads = 1\neval_every = 0\neval_batches = 1\n"
      << "[parallel]\nmicro_batches = 4\nmicro_batch_size = 2\n";
  }
  return p;
}

std::string train(const std::string& name, const std::string& sets) {
  return std::string(PF_BINARY) + " train --config " + tiny_config().string() + " --set train.out_dir=" +
         (work_dir() / name).string() + " --save " + (work_dir() / (name + ".safetensors")).string() + " " + sets;
}

std::vector<double> losses(const std::string& name) {
  std::vector<double> v;
  std::ifstream f(work_dir() / name / "log.jsonl");
  for (std::string l; std::getline(f, l);) v.push_back(nlohmann::json::parse(l)["loss"].get<double>());
  return v;
}

// The largest weight difference between two runs' saved models.
double worst_difference(const std::string& a, const std::string& b) {
  auto wa = pf_test::read_weights(work_dir() / (a + ".safetensors")), wb = pf_test::read_weights(work_dir() / (b + ".safetensors"));
  EXPECT_EQ(wa.size(), wb.size());
  double worst = 0;
  for (auto& [k, v] : wa) {
    EXPECT_EQ(v.size(), wb[k].size()) << k;
    for (size_t i = 0; i < v.size() && i < wb[k].size(); ++i) worst = std::max(worst, std::abs(double(v[i]) - wb[k][i]));
  }
  return worst;
}

constexpr double kWeightTol = 1e-6;

std::string fmt_step(int step) {
  char s[32];
  std::snprintf(s, sizeof s, "step-%06d", step);
  return s;
}

// A run's log by step (the steps it ran: a resumed run's first is after its checkpoint).
std::map<int, nlohmann::json> log_by_step(const std::string& name) {
  std::map<int, nlohmann::json> m;
  std::ifstream f(work_dir() / name / "log.jsonl");
  for (std::string l; std::getline(f, l);) {
    nlohmann::json j = nlohmann::json::parse(l);
    m[j["step"].get<int>()] = j;
  }
  return m;
}

}  // namespace

// 2 stages x 1F1B, the refreshes' measured costs scaled down (--test-kfac-cost-scale) so that every
// one fits the bubbles of one step whatever the machine's load: the plan refreshes every factor
// every 2 steps (precondition_frequency) from the first planned step; the record says so; one
// process following the record trains the pipeline's losses and weights.
TEST(SoapBubbles, OneF1B_2x1_OneProcessFollowingItsRecordTrainsTheSameWeights) {
  const fs::path profile = work_dir() / "bubbles_profile";
  const auto r = run(kEnv + kPfrun + " -np 2 " +
                     train("bubbles", "--set parallel.stages=2 --set kfac.placement=bubbles --test-kfac-cost-scale 0.001 "
                                      "--profile-dir " + profile.string() + " --profile-steps 3"));
  ASSERT_EQ(r.status, 0) << r.out;
  // The banner, the summary and the picture of step 3 (0-based 2: a refresh step) name SOAP's work.
  EXPECT_NE(r.out.find("soap (its statistics and eigenbasis refreshes in the pipeline bubbles)"), std::string::npos) << r.out;
  const nlohmann::json summary = nlohmann::json::parse(std::ifstream(work_dir() / "bubbles" / "summary.json"));
  EXPECT_EQ(summary["pipefisher_plan"]["work"], "SOAP's statistics and eigenbasis refreshes (STAT, EIG_L, EIG_R)");
  std::stringstream svg;
  svg << std::ifstream(profile / "timeline-step3.svg").rdbuf();
  for (const char* label : {"SOAP eigenbasis L", "SOAP eigenbasis R", "SOAP statistics"}) EXPECT_NE(svg.str().find(label), std::string::npos) << label;
  EXPECT_NE(r.out.find("soap: planned from steps 1-2: eigenbasis refreshes every 2 2 steps (per device), 0 of 54 "
                       "refreshes inline"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("statistics of 27 of 27 weights in a bubble"), std::string::npos) << r.out;
  const fs::path record = work_dir() / "bubbles" / "soap_refresh.json";
  const nlohmann::json rec = nlohmann::json::parse(std::ifstream(record));
  EXPECT_EQ(rec["steps"], 8);
  EXPECT_EQ(rec["plan_start"], 2);
  EXPECT_EQ(rec["period"], 2);
  // 27 rotated weights (4 blocks x 6 Linears, the pooler, the MLM head's transform, NSP's
  // classifier), each side refreshed before steps 2, 4 and 6 (0-based: the profile is 0 and 1).
  std::map<std::pair<std::string, std::string>, std::vector<int64_t>> steps;
  for (const auto& e : rec["refreshes"])
    steps[{e["weight"].get<std::string>(), e["side"].get<std::string>()}].push_back(e["step"].get<int64_t>());
  EXPECT_EQ(steps.size(), 54u);
  for (const auto& [factor, at] : steps) EXPECT_EQ(at, (std::vector<int64_t>{2, 4, 6})) << factor.first << " " << factor.second;

  const auto one = run(kEnv + train("replayed", "--set kfac.placement=replay --set kfac.refresh_record=" + record.string()));
  ASSERT_EQ(one.status, 0) << one.out;
  EXPECT_NE(one.out.find("soap: replaying the refresh record"), std::string::npos) << one.out;
  const std::vector<double> a = losses("bubbles"), b = losses("replayed");
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LE(std::abs(a[i] - b[i]), 1e-6 * std::abs(a[i])) << "step " << i + 1;
  const double followed = worst_difference("bubbles", "replayed");
  std::printf("largest weight difference, pipeline vs one process following its record: %.3g\n", followed);
  EXPECT_LE(followed, kWeightTol);

}

// On the recording run's layout the record followed is the same arithmetic as the bubbles' units
// (a refresh reads only what the previous update left, wherever in the step it runs): the same
// bits, under 1F1B, the zero-bubble schedules (H1; V, two chunks per rank), 1F1B on 2 stages x
// 2 replicas (each refreshes its copy alike; replica 0 records) and Chimera (each rank holds both
// stages, one of each pipeline; pipeline 0's copies record, and following the record refreshes
// both copies in the recorded step, so the bubbles' run had its twins aligned). On 1F1B a record
// with step 4's refreshes one step later is other bits, and so is one without refreshes.
TEST(SoapBubbles, TheRecordFollowedOnItsLayoutIsTheSameBits_1F1B_ZbH1_ZbV_2x2) {
  struct Case {
    std::string name, ranks, layout;
  };
  const std::string two = "--set parallel.stages=2 ";
  for (const Case& c : {Case{"1f1b", "2", two}, Case{"zb-h1", "2", two + "--set parallel.schedule=zb-h1 "},
                        Case{"zb-v", "2", two + "--set parallel.schedule=zb-v "},
                        Case{"2x2", "4", two + "--set parallel.data_parallel=2 --set parallel.micro_batches=2 "},
                        Case{"chimera", "2", two + "--set parallel.schedule=chimera "}}) {
    const std::string bits = "bits_" + c.name, mpi = kEnv + kPfrun + " -np " + c.ranks + " ";
    const auto r = run(mpi + train(bits, c.layout + "--set kfac.placement=bubbles --test-kfac-cost-scale 0.001"));
    ASSERT_EQ(r.status, 0) << r.out;
    const fs::path record = work_dir() / bits / "soap_refresh.json";
    // Replica 0's: each factor at steps 2, 4 and 6. Chimera's 2 devices leave bubbles small enough
    // that a busy machine's timings lengthen its cycle, so there only some refreshes are asserted.
    const size_t n = nlohmann::json::parse(std::ifstream(record))["refreshes"].size();
    if (c.name == "chimera") EXPECT_GE(n, 54u) << c.name;
    else EXPECT_EQ(n, 3u * 54) << c.name;
    const auto same = run(mpi + train(bits + "_replayed", c.layout + "--set kfac.placement=replay --set kfac.refresh_record=" +
                                                                 record.string()));
    ASSERT_EQ(same.status, 0) << same.out;
    EXPECT_EQ(losses(bits), losses(bits + "_replayed")) << c.name;
    EXPECT_EQ(worst_difference(bits, bits + "_replayed"), 0.0) << c.name;
  }
  const std::string layout = "--set parallel.stages=2 ";
  const fs::path record = work_dir() / "bits_1f1b" / "soap_refresh.json";
  nlohmann::json shifted = nlohmann::json::parse(std::ifstream(record));
  for (auto& e : shifted["refreshes"])
    if (e["step"] == 4) e["step"] = 5;
  std::ofstream(work_dir() / "shifted.json") << shifted.dump();
  const auto off = run(kEnv + kPfrun + " -np 2 " +
                       train("bits_shifted", layout + "--set kfac.placement=replay --set kfac.refresh_record=" +
                                                 (work_dir() / "shifted.json").string()));
  ASSERT_EQ(off.status, 0) << off.out;
  EXPECT_GT(worst_difference("bits_1f1b", "bits_shifted"), 0.0);
  // And the bubbles' units did refresh: the record without its refreshes is other bits too.
  shifted["refreshes"] = nlohmann::json::array();
  std::ofstream(work_dir() / "none.json") << shifted.dump();
  const auto none = run(kEnv + kPfrun + " -np 2 " +
                        train("bits_none", layout + "--set kfac.placement=replay --set kfac.refresh_record=" +
                                               (work_dir() / "none.json").string()));
  ASSERT_EQ(none.status, 0) << none.out;
  EXPECT_GT(worst_difference("bits_1f1b", "bits_none"), 0.0);
}

// One process, one set of gradients: a record refreshing every factor before every update from
// step 2 on is the inline SOAP of precondition_frequency = 1 (which refreshes after every update
// from SOAP's second step), one factor at a time instead of both sides of m at once: the same
// statistics and bases, m rotated in another order. Bound: 8 steps x lr x d x 2^-24 / eps
// (tests/optim/test_soap.cpp's rounding bound, d = 64 the longest rotated side), at eps = 0.01,
// where the refreshes matter (measured: 1e-8; refreshing every 2 steps instead, 4e-4).
TEST(SoapBubbles, ARecordOfEveryStepIsTheInlineRefreshOfEveryStep) {
  const auto bubbles = run(kEnv + kPfrun + " -np 2 " +
                           train("names", "--set parallel.stages=2 --set kfac.placement=bubbles --test-kfac-cost-scale 0.001"));
  ASSERT_EQ(bubbles.status, 0) << bubbles.out;
  nlohmann::json rec = nlohmann::json::parse(std::ifstream(work_dir() / "names" / "soap_refresh.json"));
  std::set<std::pair<std::string, std::string>> factors;
  for (const auto& e : rec["refreshes"]) factors.insert({e["weight"].get<std::string>(), e["side"].get<std::string>()});
  rec["refreshes"] = nlohmann::json::array();
  for (int step = 2; step < 8; ++step)
    for (const auto& [weight, side] : factors) {
      nlohmann::json e;
      e["step"] = step, e["weight"] = weight, e["side"] = side;
      rec["refreshes"].push_back(e);
    }
  std::ofstream(work_dir() / "every.json") << rec.dump();
  const std::string eps = "--set optim.eps=0.01 ";
  const auto replayed = run(kEnv + train("every", eps + "--set kfac.placement=replay --set kfac.refresh_record=" +
                                                      (work_dir() / "every.json").string()));
  ASSERT_EQ(replayed.status, 0) << replayed.out;
  const auto every = run(kEnv + train("inline_every", eps + "--set optim.soap.precondition_frequency=1"));
  ASSERT_EQ(every.status, 0) << every.out;
  const auto other = run(kEnv + train("inline_2", eps));
  ASSERT_EQ(other.status, 0) << other.out;
  const double bound = 8 * 1e-2 * 64 * std::ldexp(1.0, -24) / 0.01;
  const double same = worst_difference("every", "inline_every"), differs = worst_difference("every", "inline_2");
  std::printf("record of every step vs inline every step: %.3g, vs inline every 2 steps: %.3g (bound %.3g)\n", same,
              differs, bound);
  EXPECT_LE(same, bound);
  EXPECT_GT(differs, bound);
}

// A bubbles run resumes bit for bit: the checkpoint keeps the profile its plan was made from and
// the rank's refreshes, so a run resumed after the plan (step 5) remakes the same plan, and one
// resumed while profiling (step 1) profiles its second step and plans then; each trains the whole
// run's losses, gradient norms and weights, and writes its record of the whole run.
TEST(SoapBubbles, ABubblesRunResumesBitForBit) {
  const fs::path ck = work_dir() / "resume_ck";
  fs::remove_all(ck);
  const std::string bubbles = "--set parallel.stages=2 --set precond.placement=bubbles --test-kfac-cost-scale 0.001 ";
  const std::string every = "--set train.checkpoint_every=1 --set train.keep_checkpoints=0 ";
  const auto whole = run(kEnv + kPfrun + " -np 2 " + train("resume_whole", bubbles + every + "--set train.checkpoint_dir=" + ck.string()));
  ASSERT_EQ(whole.status, 0) << whole.out;
  const std::string plan = "eigenbasis refreshes every 2 2 steps (per device), 0 of 54 refreshes inline";
  ASSERT_NE(whole.out.find(plan), std::string::npos) << whole.out;
  for (const int from : {5, 1}) {
    const fs::path from_ck = work_dir() / ("resume_from_" + std::to_string(from));
    fs::remove_all(from_ck);
    fs::create_directories(from_ck);
    const std::string step = fmt_step(from);
    fs::copy(ck / step, from_ck / step, fs::copy_options::recursive);
    const std::string name = "resumed_" + std::to_string(from);
    const auto resumed = run(kEnv + kPfrun + " -np 2 " +
                             train(name, bubbles + "--resume " + from_ck.string() + " --set train.checkpoint_dir=" +
                                             (work_dir() / (name + "_ck")).string()));
    ASSERT_EQ(resumed.status, 0) << resumed.out;
    EXPECT_NE(resumed.out.find(plan), std::string::npos) << resumed.out;
    const auto want = log_by_step("resume_whole"), got = log_by_step(name);
    int compared = 0;
    for (const auto& [s, j] : got) {
      if (s <= from) continue;
      ++compared;
      EXPECT_EQ(j.at("loss").get<double>(), want.at(s).at("loss").get<double>()) << name << " step " << s;
      EXPECT_EQ(j.at("grad_norm").get<double>(), want.at(s).at("grad_norm").get<double>()) << name << " step " << s;
    }
    EXPECT_EQ(compared, 8 - from) << name;
    EXPECT_EQ(worst_difference("resume_whole", name), 0.0) << name;
    const auto record = [](const std::string& n) {
      return nlohmann::json::parse(std::ifstream(work_dir() / n / "soap_refresh.json"));
    };
    EXPECT_EQ(record(name), record("resume_whole")) << name;
  }
}

// precond.min_refresh_steps (kfac.min_refresh_steps by its old name) lengthens SOAP's planned
// cycle past optim.soap.precondition_frequency (2 here), as it does K-FAC's.
TEST(SoapBubbles, MinRefreshStepsLengthensThePlannedCycle) {
  for (const std::string key : {"precond.min_refresh_steps", "kfac.min_refresh_steps"}) {
    const auto r = run(kEnv + kPfrun + " -np 2 " +
                       train("min_refresh_" + key, "--set parallel.stages=2 --set precond.placement=bubbles --set " + key +
                                                "=3 --test-kfac-cost-scale 0.001"));
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("soap: planned from steps 1-2: eigenbasis refreshes every 3 3 steps"), std::string::npos)
        << key << "\n" << r.out;
  }
}

// What SOAP's work may not do, refused before training with exit 2 and the key, by its new name
// whichever name set it (kfac.placement is its old one).
TEST(SoapBubbles, PlacementsSoapCannotRunAreRefusedNamingTheKey) {
  for (const std::string& sets : {std::string("--set precond.placement=bubbles"),
                                  std::string("--set precond.placement=adaptive"), std::string("--set kfac.placement=adaptive")}) {
    const auto r = run(kEnv + train("refused", sets));
    EXPECT_EQ(r.status, 2) << sets << "\n" << r.out;
    EXPECT_NE(r.out.find("precond.placement: '"), std::string::npos) << r.out;
  }
  const auto r = run(kEnv + train("refused", "--set kfac.placement=replay"));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("precond.refresh_record: "), std::string::npos) << r.out;
}

// precond.placement = skip (SOAP's statistics only on the refresh steps: test_soap.cpp's reference)
// trains on 2 stages what it trains in one process, and is not inline SOAP: at optim.eps = 0.01
// (where the basis shows) the two differ far beyond rounding.
TEST(SoapBubbles, SkipInAPipelineTrainsWhatOneProcessTrainsAndIsNotInline) {
  const auto one = run(kEnv + train("skip_1", "--set precond.placement=skip"));
  ASSERT_EQ(one.status, 0) << one.out;
  EXPECT_NE(one.out.find("soap (skip: its statistics only on the refresh steps, every 2)"), std::string::npos) << one.out;
  const auto two = run(kEnv + kPfrun + " -np 2 " + train("skip_2", "--set parallel.stages=2 --set kfac.placement=skip"));
  ASSERT_EQ(two.status, 0) << two.out;
  EXPECT_LE(worst_difference("skip_1", "skip_2"), kWeightTol);
  const auto skip = run(kEnv + train("skip_eps", "--set optim.eps=0.01 --set precond.placement=skip"));
  const auto every = run(kEnv + train("inline_eps", "--set optim.eps=0.01"));
  ASSERT_EQ(skip.status, 0) << skip.out;
  ASSERT_EQ(every.status, 0) << every.out;
  const double bound = 8 * 1e-2 * 64 * std::ldexp(1.0, -24) / 0.01;  // as ARecordOfEveryStepIsTheInlineRefreshOfEveryStep
  EXPECT_GT(worst_difference("skip_eps", "inline_eps"), 10 * bound);
}

// The plan line of a run's output, after "soap: planned from <source>: ".
std::string plan_line(const std::string& out) {
  const size_t at = out.find("soap: planned from ");
  if (at == std::string::npos) return "";
  const size_t from = out.find(": ", at + 19), end = out.find('\n', at);
  return out.substr(from + 2, end - from - 2);
}

// A bubbles run writes the profile its plan was made from (out_dir/soap_profile.json); a run
// planning from it (precond.plan_profile) makes the same plan whatever its own timings, refreshes
// as the recording run did and, on its layout, trains its bits.
TEST(SoapBubbles, ARunPlannedFromTheRecordedProfileIsTheRecordingRun) {
  const std::string mpi = kEnv + kPfrun + " -np 2 ", layout = "--set parallel.stages=2 --set kfac.placement=bubbles "
                                                                "--test-kfac-cost-scale 0.001 ";
  const auto a = run(mpi + train("recording", layout));
  ASSERT_EQ(a.status, 0) << a.out;
  const fs::path profile = work_dir() / "recording" / "soap_profile.json";
  ASSERT_TRUE(fs::exists(profile)) << a.out;
  const auto b = run(mpi + train("from_profile", layout + "--set precond.plan_profile=" + profile.string()));
  ASSERT_EQ(b.status, 0) << b.out;
  EXPECT_NE(b.out.find("soap: planned from precond.plan_profile = " + profile.string() + ": "), std::string::npos) << b.out;
  EXPECT_FALSE(plan_line(a.out).empty()) << a.out;
  EXPECT_EQ(plan_line(a.out), plan_line(b.out));
  auto refreshes = [](const std::string& name) {
    return nlohmann::json::parse(std::ifstream(work_dir() / name / "soap_refresh.json"))["refreshes"];
  };
  EXPECT_EQ(refreshes("recording"), refreshes("from_profile"));
  EXPECT_EQ(worst_difference("recording", "from_profile"), 0.0);
  // The plan is the profile's, not the run's timings: with every L refresh 10 s long (after the
  // cost scale) none fits a bubble, and the plan says so.
  nlohmann::json slow = nlohmann::json::parse(std::ifstream(profile));
  for (auto& stage : slow["stages"])
    for (auto& w : stage["soap_weights"]) w["eigenbasis_l"] = 1e7;
  const fs::path slow_path = work_dir() / "slow_profile.json";
  std::ofstream(slow_path) << slow.dump();
  const auto c = run(mpi + train("from_slow_profile", layout + "--set precond.plan_profile=" + slow_path.string()));
  ASSERT_EQ(c.status, 0) << c.out;
  EXPECT_NE(c.out.find("27 of 54 refreshes inline"), std::string::npos) << c.out;
}

// Chimera on 2 ranks: both pipelines' copies of a stage refresh each factor in the same step, so
// one process following the record (pipeline 0's refreshes) trains the pipeline's losses and
// weights, as under 1F1B.
TEST(SoapBubbles, Chimera_2x1_OneProcessFollowingItsRecordTrainsTheSameWeights) {
  const auto r = run(kEnv + kPfrun + " -np 2 " +
                     train("chimera", "--set parallel.stages=2 --set parallel.schedule=chimera --set kfac.placement=bubbles "
                                      "--set parallel.micro_batches=2 --test-kfac-cost-scale 0.001"));
  ASSERT_EQ(r.status, 0) << r.out;
  // 2 copies of 54 factors; how many a bubble takes depends on the machine's timings (2 micro-batches
  // leave the bubbles room enough that here none ran inline).
  EXPECT_NE(r.out.find("of 108 refreshes inline"), std::string::npos) << r.out;
  const fs::path record = work_dir() / "chimera" / "soap_refresh.json";
  std::map<std::pair<std::string, std::string>, std::vector<int64_t>> steps;
  const nlohmann::json rec = nlohmann::json::parse(std::ifstream(record));
  for (const auto& e : rec["refreshes"])
    steps[{e["weight"].get<std::string>(), e["side"].get<std::string>()}].push_back(e["step"].get<int64_t>());
  // Every factor, each step of it once (pipeline 0's copy alone); the steps themselves depend on
  // the machine's timings (a busy machine lengthens the cycle).
  EXPECT_EQ(steps.size(), 54u);
  for (const auto& [factor, at] : steps) {
    EXPECT_EQ(std::set<int64_t>(at.begin(), at.end()).size(), at.size()) << factor.first << " " << factor.second;
    EXPECT_GE(at.front(), 2) << factor.first;
  }
  const auto one = run(kEnv + train("chimera_replayed", "--set parallel.micro_batches=2 --set kfac.placement=replay "
                                                        "--set kfac.refresh_record=" + record.string()));
  ASSERT_EQ(one.status, 0) << one.out;
  const std::vector<double> a = losses("chimera"), b = losses("chimera_replayed");
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LE(std::abs(a[i] - b[i]), 1e-6 * std::abs(a[i])) << "step " << i + 1;
  EXPECT_LE(worst_difference("chimera", "chimera_replayed"), kWeightTol);
}
