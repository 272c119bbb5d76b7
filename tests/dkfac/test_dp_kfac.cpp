// Data-parallel K-FAC under real mpirun (scripts/pfrun, 1 thread per rank): a tiny BERT on the
// committed sample, 3 steps, run by the one executor (runtime/executor.hpp) with one stage and by
// pipelines x data. D-KFAC, MPD-KFAC and SPD-KFAC (and SPD's ablations) must give the same
// weights (they differ only in when and where the same sums and inversions happen), and those
// must equal single-process K-FAC training of the same global batch. The first two steps
// profile, the third runs the pipelined, fused all-reduces, so every path is exercised.
//
// A perf-model cache written by the test pins the plans: all-reduce start-up 1 ms (everything
// fuses), free broadcasts (every inverse is communicated, so Algorithm 1 places all of them).
// One run measures the model instead, and must leave a cache file behind.
#include "comm/perf_model.hpp"
#include "io/safetensors.hpp"
#include "../support/launch.hpp"
#include "../support/weights.hpp"
#include "../support/scratch.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

using pf_test::Launch;
using pf_test::run;

fs::path work_dir() {
  static const fs::path d = [] {
    fs::path p = pf_test::scratch_dir("dkfac_test");
    fs::create_directories(p / "pinned");
    fs::create_directories(p / "measured");
    return p;
  }();
  return d;
}

// The pinned model for W ranks of 1 thread.
void pin_model(int ranks) {
  pf::comm::PerfModel m;
  m.key = pf::comm::machine_key(ranks, 1);
  m.allreduce = {1e-3, 1e-9};
  m.broadcast = {0, 0};
  m.inversion = {1e-9, 1e-6};
  std::ofstream(work_dir() / "pinned" / ("perf-model-" + m.key + ".json")) << pf::comm::perf_model_to_json(m);
}

// Tiny BERT: 2 blocks, hidden 32, ffn 64 (13 K-FAC layers: 6 per block and the head transform; 26 factors); 2 micro-batches of 2
// sequences per replica.
fs::path config(int micro_batches_total) {
  fs::path p = work_dir() / ("tiny" + std::to_string(micro_batches_total) + ".toml");
  if (!fs::exists(p)) {
    std::ofstream f(p);
    f << "[model]\narch = \"bert\"\nlayers = 2\nhidden = 32\nheads = 2\nffn = 64\nseq_len = 16\nmax_position = 16\n"
      << "[data]\nvocab = \"bert\"\ntrain_file = \"" PF_SOURCE_DIR "/data/sample/moby-dick-1-20.bert.bin\"\n"
      << "valid_file = \"" PF_SOURCE_DIR "/data/sample/moby-dick-1-20.bert.bin\"\n"
      << "[optim]\nname = \"nvlamb\"\nlr = 1e-2\nwarmup_steps = 1\n"
      << "[train]\nsteps = 3\nthreads = 1\neval_every = 0\neval_batches = 1\n"
      << "[parallel]\nmicro_batch_size = 2\nmicro_batches = " << micro_batches_total << "\n"
      << "[kfac]\nenabled = true\nplacement = \"inline\"\ndamping = 1e-2\n";
  }
  return p;
}

// Runs W ranks (W x 2 micro-batches of 2 sequences per step); returns the run's directory name.
Launch train(const std::string& name, int ranks, const std::string& sets, const std::string& cache = "pinned") {
  const std::string cmd = "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PF_CACHE_DIR=" + (work_dir() / cache).string() +
                          " " PF_SOURCE_DIR "/scripts/pfrun -np " + std::to_string(ranks) + " " PF_BINARY +
                          " train --config " + config(2).string() + " --set parallel.data_parallel=" +
                          std::to_string(ranks) + " --set train.out_dir=" + (work_dir() / name).string() + " " + sets;
  return run(cmd);
}

std::map<std::string, std::vector<float>> weights(const std::string& name) {
  return pf_test::read_weights(work_dir() / name / "model.safetensors");
}

nlohmann::json dkfac_json(const std::string& name) {
  std::ifstream f(work_dir() / name / "dkfac.json");
  return nlohmann::json::parse(f);
}

// Largest absolute weight difference; also checks the runs moved the weights at all.
double max_diff(const std::string& a, const std::string& b) {
  const auto wa = weights(a), wb = weights(b);
  EXPECT_EQ(wa.size(), wb.size());
  double d = 0;
  for (const auto& [name, v] : wa) {
    const auto it = wb.find(name);
    if (it == wb.end() || it->second.size() != v.size()) return INFINITY;
    for (size_t i = 0; i < v.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(v[i]) - it->second[i]));
  }
  return d;
}

// Strategies among themselves: the same sums (up to the association MPI's reduction picks for a
// message size) and the same inversion code. Against one process: summation order of factors
// and gradients differs (per replica, then across replicas). A wrong factor scale, a missing
// replica's rows or a stale inverse moves weights by ~lr = 1e-2.
constexpr double kStrategyTol = 1e-6;
constexpr double kSingleTol = 1e-5;

void strategies_agree(int ranks) {
  pin_model(ranks);
  const std::string w = std::to_string(ranks);
  const std::vector<std::pair<std::string, std::string>> runs = {
      {"d" + w, "--set kfac.distributed=d-kfac"},
      {"mpd" + w, "--set kfac.distributed=mpd-kfac"},
      {"spd" + w, "--set kfac.distributed=spd-kfac"},
      {"spd_nopipe" + w, "--set kfac.distributed=spd-kfac --set kfac.spd_pipelining=false"},
  };
  for (const auto& [name, sets] : runs) {
    const Launch r = train(name, ranks, sets);
    ASSERT_EQ(r.status, 0) << name << "\n" << r.out;
  }
  for (size_t i = 1; i < runs.size(); ++i) {
    const double d = max_diff(runs[0].first, runs[i].first);
    std::printf("  %d ranks: max |w(d-kfac) - w(%s)| = %.3g\n", ranks, runs[i].first.c_str(), d);
    EXPECT_LE(d, kStrategyTol) << runs[i].first;
  }

  // What each strategy did: d-kfac broadcasts nothing, mpd-kfac everything round-robin by layer
  // (Eq. 22: layer l's A and B on rank l % W); spd-kfac
  // with free broadcasts communicates every factor, placed by Algorithm 1, and its pipelined
  // step fused the factor all-reduces (1 ms start-up): fewer messages than factors.
  const auto d = dkfac_json("d" + w), mpd = dkfac_json("mpd" + w), spd = dkfac_json("spd" + w);
  EXPECT_EQ(d["placement"]["communicated"], 0);
  EXPECT_EQ(mpd["placement"]["communicated"], 26);
  EXPECT_EQ(spd["placement"]["communicated"], 26);
  const auto owner = mpd["placement"]["owner"].get<std::vector<int>>();
  for (size_t f = 0; f < owner.size(); ++f) EXPECT_EQ(owner[f], static_cast<int>(f / 2) % ranks);  // by layer (A, B)
  EXPECT_TRUE(spd["pipelining"].get<bool>());
  EXPECT_GE(spd["factor_messages"].get<double>(), 2);  // at least one A and one B message
  EXPECT_LT(spd["factor_messages"].get<double>(), 26);
  EXPECT_EQ(d["factor_messages"].get<double>(), 1);   // one fused message after the backward
}

TEST(DpKfac, StrategiesGiveTheSameWeightsOn2Ranks) { strategies_agree(2); }
TEST(DpKfac, StrategiesGiveTheSameWeightsOn4Ranks) { strategies_agree(4); }

TEST(DpKfac, EqualsSingleProcessKfacOfTheSameGlobalBatch) {
  pin_model(2);
  // 2 ranks x 2 micro-batches == one process with 4 micro-batches (the same global numbering).
  const Launch one = run("OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 " PF_BINARY " train --config " +
                         config(4).string() + " --set train.out_dir=" + (work_dir() / "single").string());
  ASSERT_EQ(one.status, 0) << one.out;
  const Launch two = train("spd_vs_single", 2, "--set kfac.distributed=spd-kfac");
  ASSERT_EQ(two.status, 0) << two.out;
  const double d = max_diff("single", "spd_vs_single");
  std::printf("  max |w(one process) - w(spd-kfac, 2 ranks)| = %.3g\n", d);
  EXPECT_LE(d, kSingleTol);
  // ... and not trivially: the weights moved from their initial values by far more.
  const Launch zero = run("OMP_NUM_THREADS=1 " PF_BINARY " train --config " + config(4).string() +
                          " --steps 1 --set optim.lr=1e-30 --set train.out_dir=" + (work_dir() / "init").string());
  ASSERT_EQ(zero.status, 0) << zero.out;
  EXPECT_GT(max_diff("single", "init"), 100 * kSingleTol);
}

// The one executor with one rank (--profile-dir takes a one-process run there instead of the
// Trainer) is the single-process Trainer's K-FAC, and its profile is written.
TEST(DpKfac, OneRankOfTheRuntimeEqualsTheTrainer) {
  const Launch one = run("OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 " PF_BINARY " train --config " +
                         config(2).string() + " --set train.out_dir=" + (work_dir() / "single2").string());
  ASSERT_EQ(one.status, 0) << one.out;
  const Launch r = train("runtime1", 1, "--profile-dir " + (work_dir() / "runtime1" / "profile").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("1 stages (1f1b) x 1 data-parallel"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(work_dir() / "runtime1" / "profile" / "profile.json"));
  const double d = max_diff("single2", "runtime1");
  std::printf("  max |w(trainer) - w(runtime, 1 rank)| = %.3g\n", d);
  EXPECT_LE(d, kSingleTol);
}

// SPD-KFAC's pieces in a pipeline x data layout: 2 stages x 2 replicas, each stage's factor
// all-reduces pipelined and fused (the pinned 1 ms start-up fuses them) and its inversions placed
// over its 2 replicas, equal to single-process K-FAC of the same global batch (4 micro-batches);
// KL-clip too, with v.g summed over the stages.
TEST(DpKfac, PipelineTimesDataWithSpdKfacEqualsSingleProcess) {
  pin_model(2);
  for (const std::string clip : {"0", "1e-4"}) {
    const std::string tag = clip == "0" ? "" : "_klclip";
    const Launch one = run("OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 " PF_BINARY " train --config " +
                           config(4).string() + " --set kfac.kl_clip=" + clip + " --set train.out_dir=" +
                           (work_dir() / ("single4" + tag)).string());
    ASSERT_EQ(one.status, 0) << one.out;
    const std::string cmd = "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PF_CACHE_DIR=" + (work_dir() / "pinned").string() +
                            " " PF_SOURCE_DIR "/scripts/pfrun -np 4 " PF_BINARY " train --config " + config(2).string() +
                            " --set parallel.stages=2 --set parallel.data_parallel=2 --set kfac.kl_clip=" + clip +
                            " --set train.out_dir=" + (work_dir() / ("spd_2x2" + tag)).string();
    const Launch r = run(cmd);
    ASSERT_EQ(r.status, 0) << r.out;
    const double d = max_diff("single4" + tag, "spd_2x2" + tag);
    std::printf("  kl_clip %s: max |w(one process) - w(spd-kfac, 2 stages x 2 replicas)| = %.3g\n", clip.c_str(), d);
    EXPECT_LE(d, kSingleTol);
    const auto j = dkfac_json("spd_2x2" + tag);
    EXPECT_TRUE(j["pipelining"].get<bool>());
    EXPECT_EQ(j["factors"], 26);
    EXPECT_EQ(j["placement"]["communicated"], 26);  // free broadcasts: every inverse from one replica
    EXPECT_EQ(j["stages"].size(), 2u);
    // Unfused, each rank would send one message per factor of its stage (12 and 14).
    EXPECT_LT(j["factor_messages"].get<double>(), 12);
  }
  // The clip bites at this size (otherwise the second comparison proves nothing).
  EXPECT_GT(max_diff("single4", "single4_klclip"), 100 * kSingleTol);
}

TEST(DpKfac, MeasuresThePerfModelOnceAndCachesIt) {
  const Launch r = train("measured", 2, "--set train.steps=1", "measured");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("perf model measured"), std::string::npos) << r.out;
  const fs::path cached = work_dir() / "measured" / ("perf-model-" + pf::comm::machine_key(2, 1) + ".json");
  ASSERT_TRUE(fs::exists(cached));
  std::ifstream f(cached);
  const pf::comm::PerfModel m = pf::comm::perf_model_from_json(std::string(std::istreambuf_iterator<char>(f), {}));
  // Measured, not defaulted. On a loaded machine the size term can drown in noise, and the fit
  // then keeps a constant (beta = 0, see fit_linear): the cost as a whole must still be positive.
  EXPECT_GE(m.allreduce.beta, 0);
  EXPECT_GT(m.allreduce.alpha + m.allreduce.beta, 0);
  EXPECT_GT(m.inversion.c, 0);
  const Launch again = train("measured2", 2, "--set train.steps=1", "measured");
  ASSERT_EQ(again.status, 0) << again.out;
  EXPECT_NE(again.out.find("perf model cached"), std::string::npos) << again.out;
  // A cached cost that is negative (an older fit's intercept) is not used: measured again.
  pf::comm::PerfModel bad = m;
  bad.broadcast.alpha = -1.7e-3;
  std::ofstream(cached) << pf::comm::perf_model_to_json(bad);
  const Launch remeasured = train("measured3", 2, "--set train.steps=1", "measured");
  ASSERT_EQ(remeasured.status, 0) << remeasured.out;
  EXPECT_NE(remeasured.out.find("perf model measured"), std::string::npos) << remeasured.out;
  std::ifstream g(cached);
  EXPECT_GE(pf::comm::perf_model_from_json(std::string(std::istreambuf_iterator<char>(g), {})).broadcast.alpha, 0);
}

TEST(DpKfac, MisuseFailsWithOneLineNamingTheKey) {
  const Launch r = run(std::string(PF_BINARY) + " train --config " + config(2).string() +
                       " --set kfac.distributed=d-kfac --set kfac.spd_balance=false");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("kfac.spd_balance"), std::string::npos) << r.out;
  const Launch w = train("bad_world", 2, "--set parallel.data_parallel=3");
  EXPECT_EQ(w.status, 2) << w.out;
  EXPECT_NE(w.out.find("parallel.data_parallel"), std::string::npos) << w.out;
  // One stage has no bubbles to fill: refused on one line, before anything runs.
  const Launch b = train("bubbles_one_stage", 2, "--set kfac.placement=bubbles");
  EXPECT_EQ(b.status, 2) << b.out;
  EXPECT_NE(b.out.find("kfac.placement: 'bubbles' fills pipeline bubbles"), std::string::npos) << b.out;
  EXPECT_FALSE(fs::exists(work_dir() / "bubbles_one_stage" / "log.jsonl"));
  const Launch a = train("adaptive_one_stage", 2, "--set kfac.placement=adaptive");
  EXPECT_EQ(a.status, 2) << a.out;
  EXPECT_NE(a.out.find("kfac.placement: 'adaptive' fills pipeline bubbles"), std::string::npos) << a.out;
  EXPECT_FALSE(fs::exists(work_dir() / "adaptive_one_stage" / "log.jsonl"));
}

}  // namespace
