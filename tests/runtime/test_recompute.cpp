// Activation recomputation (parallel.recompute, runtime/executor.hpp) under real mpirun, 2 ranks of
// 1 thread: a pipeline that keeps only its stages' inputs and re-runs each forward just before the
// backward trains exactly like one that keeps every activation, and holds less.
//
// What is asserted: the same losses and final weights BIT FOR BIT. Why that holds and is not
// pinned to a kernel: the re-run applies the same kernels to the same input on the same thread
// count (deterministic mode), with the same dropout masks (drawn from seed, step, micro-batch),
// so the state it rebuilds is the first forward's, bit for bit; the backward, the gradient sums and
// K-FAC's factor sums then run in the same order (each chunk takes its micro-batches' forwards and
// backwards in the same ascending order, so A summed at the re-runs sums in F's order). Both runs
// use the same machine and build, so nothing here depends on which BLAS kernel ran. (K-FAC in the
// bubbles is compared with single-process K-FAC instead: see below.)
//
// Memory: out_dir/activations.json reports, per rank, the bytes its forwards kept for backwards
// at the peak. Without recompute that is the micro-batches in flight x the stage's state; with
// it, their inputs plus one state. The in-flight counts come from the simulator's timeline of the
// same schedule, and the memory model (sim/memory.cpp, its R) moves the same way.
#include "schedule/generators.hpp"
#include "sim/memory.hpp"
#include "sim/sim.hpp"
#include "../support/launch.hpp"
#include "../support/scratch.hpp"
#include "../support/weights.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

fs::path dir() { return pf_test::scratch_dir("recompute_test"); }
// A run's outputs: "recompute_" + name, apart from the other runtime tests' in the shared dir().
fs::path out(const std::string& name) { return dir() / ("recompute_" + name); }

// Tiny BERT (4 blocks, hidden 32) with dropout on the committed sample; 4 micro-batches of 2.
fs::path config_file() {
  fs::path p = out("tiny.toml");
  if (!fs::exists(p))
    std::ofstream(p) << "[model]\narch = \"bert\"\nlayers = 4\nhidden = 32\nheads = 2\nffn = 64\nseq_len = 16\n"
                     << "max_position = 16\ndropout = 0.1\n"
                     << "[data]\nvocab = \"bert\"\ntrain_file = \"" PF_SOURCE_DIR "/data/sample/moby-dick-1-20.bert.bin\"\n"
                     << "valid_file = \"" PF_SOURCE_DIR "/data/sample/moby-dick-1-20.bert.bin\"\n"
                     << "[optim]\nname = \"nvlamb\"\nlr = 1e-2\nwarmup_steps = 1\n"
                     << "[train]\nsteps = 4\nthreads = 1\neval_every = 0\neval_batches = 1\n"
                     << "[parallel]\nstages = 2\nmicro_batches = 4\nmicro_batch_size = 2\n"
                     << "[kfac]\ndamping = 3e-2\n";
  return p;
}

const std::string kGpt = "--set model.arch=gpt --set data.vocab=gpt2 --set data.train_file=" PF_SOURCE_DIR
                         "/data/sample/moby-dick-1-20.gpt2.bin --set data.valid_file=" PF_SOURCE_DIR
                         "/data/sample/moby-dick-1-20.gpt2.bin";

pf_test::Launch launch(const std::string& name, const std::string& sets, const std::string& env = "") {
  const std::string export_env = env.empty() ? "" : " -x " + env.substr(0, env.find('='));
  return pf_test::run(env + " OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 " PF_SOURCE_DIR "/scripts/pfrun -np 2" +
                      export_env + " " PF_BINARY " train --config " + config_file().string() + " --set train.out_dir=" +
                      out(name).string() + " --save " + out(name + ".safetensors").string() + " " + sets);
}

nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(std::ifstream(p)); }

std::vector<double> losses(const std::string& name) {
  std::vector<double> v;
  std::ifstream f(out(name) / "log.jsonl");
  for (std::string l; std::getline(f, l);) v.push_back(nlohmann::json::parse(l)["loss"].get<double>());
  return v;
}

// Runs `sets` with recompute off and on; both must give the same losses and weights, bit for bit.
void expect_recompute_changes_nothing(const std::string& name, const std::string& sets, const std::string& env = "") {
  pf_test::Launch off = launch(name + "_off", sets, env);
  pf_test::Launch on = launch(name + "_on", sets + " --set parallel.recompute=true", env);
  ASSERT_EQ(off.status, 0) << off.out;
  ASSERT_EQ(on.status, 0) << on.out;
  EXPECT_FALSE(read_json(out(name + "_off") / "activations.json")["recompute"].get<bool>());
  EXPECT_TRUE(read_json(out(name + "_on") / "activations.json")["recompute"].get<bool>());
  const std::vector<double> a = losses(name + "_off"), b = losses(name + "_on");
  ASSERT_EQ(a.size(), 4u) << off.out;
  EXPECT_EQ(a, b) << name;
  const auto wa = pf_test::read_weights(out(name + "_off.safetensors"));
  EXPECT_GT(wa.size(), 10u);
  EXPECT_TRUE(wa == pf_test::read_weights(out(name + "_on.safetensors"))) << name << ": weights differ";
  std::printf("[ %s ] losses %.9f .. %.9f, equal with recompute on\n", name.c_str(), a.front(), a.back());
}

TEST(Recompute, BertOneF1BWithDropout) { expect_recompute_changes_nothing("bert_1f1b", ""); }
TEST(Recompute, GptOneF1BWithDropout) { expect_recompute_changes_nothing("gpt_1f1b", kGpt); }
TEST(Recompute, BertChimeraWithDropout) {
  expect_recompute_changes_nothing("bert_chimera", "--set parallel.schedule=chimera");
}
// Interleaved: a stage's input is the previous chunk's output on the same device; ZB-H1: the
// re-run comes before I, which then runs the whole backward (W nothing), against I and W apart.
TEST(Recompute, InterleavedAndZeroBubble) {
  expect_recompute_changes_nothing("interleaved", "--set parallel.schedule=interleaved --set parallel.virtual_stages=2");
  expect_recompute_changes_nothing("zbh1", "--set parallel.schedule=zb-h1");
}
// K-FAC inline: the curvature taps see each micro-batch's inputs once, at the re-run.
TEST(Recompute, KfacInlineOneF1BAndChimera) {
  expect_recompute_changes_nothing("kfac_inline_1f1b", "--set kfac.enabled=true --set kfac.placement=inline");
  expect_recompute_changes_nothing("kfac_inline_chimera_gpt", kGpt + " --set kfac.enabled=true --set "
                                   "kfac.placement=inline --set parallel.schedule=chimera");
}
// K-FAC in the bubbles: CURV_A waits for the backward's re-run, so the plan may refresh A a step
// later than without recompute (another refresh pattern, other weights). Those runs are checked
// against single-process K-FAC following their own record (test_pipefisher_bubbles.cpp,
// BubblesWithRecomputeEqualSingleProcessWithSamePattern).

// The bytes held at the peak, per device: without recompute the micro-batches in flight (the
// simulator's count; GPipe 2x4: all 4 on both devices) x the stage's state; with it, their inputs
// plus one state (device 0's input is the micro-batch itself: 0 bytes). The worst device holds
// less with recompute, as the memory model's worst device does. (1F1B's last stage holds one
// micro-batch either way, so there recompute adds its input; GPipe shows the saving everywhere.)
TEST(Recompute, HeldActivationsFallAsTheMemoryModelSays) {
  const pf_test::Launch r_off = launch("gpipe_off", "--set parallel.schedule=gpipe --set train.steps=1");
  const pf_test::Launch r_on = launch("gpipe_on", "--set parallel.schedule=gpipe --set train.steps=1 --set parallel.recompute=true");
  ASSERT_EQ(r_off.status, 0) << r_off.out;
  ASSERT_EQ(r_on.status, 0) << r_on.out;
  EXPECT_NE(r_on.out.find("activation memory: at most"), std::string::npos) << r_on.out;
  EXPECT_EQ(losses("gpipe_off"), losses("gpipe_on"));  // and GPipe trains the same, bit for bit
  EXPECT_TRUE(pf_test::read_weights(out("gpipe_off.safetensors")) == pf_test::read_weights(out("gpipe_on.safetensors")));
  const nlohmann::json off = read_json(out("gpipe_off") / "activations.json");
  const nlohmann::json on = read_json(out("gpipe_on") / "activations.json");
  const pf::Schedule s = pf::make_schedule("gpipe", 2, 4);
  const pf::Timeline tl = pf::simulate(s, pf::CostModel{});
  ASSERT_EQ(off["ranks"].size(), 2u);
  ASSERT_EQ(on["ranks"].size(), 2u);
  std::vector<pf::StageMemory> model(2);
  int64_t worst_off = 0, worst_on = 0;
  for (size_t r = 0; r < 2; ++r) {
    const nlohmann::json& a = off["ranks"][r];
    const nlohmann::json& b = on["ranks"][r];
    const int d = a["device"].get<int>();
    ASSERT_EQ(a["stages"].size(), 1u);
    const int64_t state = a["stages"][0]["state_bytes"].get<int64_t>();
    const int64_t input = a["stages"][0]["input_bytes"].get<int64_t>();
    EXPECT_EQ(b["stages"][0]["state_bytes"].get<int64_t>(), state);
    EXPECT_EQ(input, d == 0 ? 0 : 2 * 16 * 32 * 4);  // rows x seq x hidden floats
    const int in_flight = tl.peak_in_flight[d];
    EXPECT_EQ(in_flight, 4);
    EXPECT_EQ(a["peak_bytes"].get<int64_t>(), in_flight * state) << "device " << d;
    EXPECT_EQ(b["peak_bytes"].get<int64_t>(), in_flight * input + state) << "device " << d;
    // One state per micro-batch made at set-up, one in all with recompute.
    EXPECT_EQ(a["allocated_bytes"].get<int64_t>(), 4 * state);
    EXPECT_EQ(b["allocated_bytes"].get<int64_t>(), state);
    worst_off = std::max(worst_off, a["peak_bytes"].get<int64_t>());
    worst_on = std::max(worst_on, b["peak_bytes"].get<int64_t>());
    model[d].act = state / 1e6;  // MB, the model's unit
    std::printf("[ device %d ] state %lld B, input %lld B: peak held %lld B without recompute, %lld B with\n", d,
                static_cast<long long>(state), static_cast<long long>(input),
                static_cast<long long>(a["peak_bytes"].get<int64_t>()), static_cast<long long>(b["peak_bytes"].get<int64_t>()));
  }
  EXPECT_LT(worst_on, worst_off);
  const pf::MemoryReport m_off = pf::memory_model(s, tl, model, false), m_on = pf::memory_model(s, tl, model, true);
  EXPECT_LT(m_on.activations_in_flight, m_off.activations_in_flight);
  EXPECT_LT(m_on.m_pipe, m_off.m_pipe);
  // Without recompute the model's in-flight peak is the runtime's worst device, to the byte.
  EXPECT_NEAR(m_off.activations_in_flight * 1e6, static_cast<double>(worst_off), 1e-3);
  std::printf("memory model, worst device: %.6f MB in flight without R, %.6f MB with; runtime %.6f MB -> %.6f MB\n",
              m_off.activations_in_flight, m_on.activations_in_flight, worst_off / 1e6, worst_on / 1e6);
}

// ZB-H1 and ZB-H2 without recompute split the backward: a forward's state is held until its W,
// and the output gradients W reads from its I until its W. Given each stage's state and deferred
// bytes, the memory model over the simulator's timeline of the same schedule (whose device order
// the runtime follows) predicts every device's peak to the byte.
void expect_split_memory_as_modelled(const std::string& schedule) {
  const std::string name = schedule + "_memory";
  const pf_test::Launch r = launch(name, "--set parallel.schedule=" + schedule + " --set train.steps=1");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = read_json(out(name) / "activations.json");
  const pf::Schedule s = pf::make_schedule(schedule, 2, 4);
  const pf::Timeline tl = pf::simulate(s, pf::CostModel{});
  ASSERT_EQ(j["ranks"].size(), 2u);
  for (const nlohmann::json& rank : j["ranks"]) {
    const int d = rank["device"].get<int>();
    SCOPED_TRACE(schedule + " device " + std::to_string(d));
    ASSERT_EQ(rank["stages"].size(), 1u);
    const int64_t state = rank["stages"][0]["state_bytes"].get<int64_t>();
    const int64_t deferred = rank["stages"][0]["deferred_bytes"].get<int64_t>();
    EXPECT_GT(deferred, 0);
    EXPECT_EQ(rank["allocated_bytes"].get<int64_t>(), 4 * (state + deferred));
    std::vector<pf::StageMemory> model(2);  // this device's stage only: the model's worst device is d
    model[d].act = state / 1e6;
    model[d].deferred = deferred / 1e6;
    const pf::MemoryReport m = pf::memory_model(s, tl, model, false);
    ASSERT_EQ(m.device, d);
    EXPECT_NEAR(m.activations_in_flight * 1e6, static_cast<double>(rank["peak_bytes"].get<int64_t>()), 1e-3);
    EXPECT_GT(rank["peak_bytes"].get<int64_t>(), tl.peak_in_flight[d] * state);  // W's gradients count
  }
}

TEST(SplitBackwardMemory, ZeroBubbleHoldsWhatTheMemoryModelSays) {
  expect_split_memory_as_modelled("zb-h1");
  expect_split_memory_as_modelled("zb-h2");
}

// A zb-h1 run's measured profile carries each stage's M_act and M_W as the executor holds them
// (mem_act, mem_deferred), so `plan --profile` of it reports the activation peak the runtime
// measured on the worst device, to the byte.
TEST(SplitBackwardMemory, MeasuredProfileGivesThePlanTheRuntimesPeak) {
  const fs::path prof = out("zbh1_profile");
  const pf_test::Launch r =
      launch("zbh1_profiled", "--set parallel.schedule=zb-h1 --set train.steps=3 --profile-dir " + prof.string());
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json held = read_json(out("zbh1_profiled") / "activations.json");
  const nlohmann::json profile = read_json(prof / "profile.json");
  ASSERT_EQ(held["ranks"].size(), 2u);
  for (const nlohmann::json& rank : held["ranks"]) {
    const nlohmann::json& st = rank["stages"][0];
    const nlohmann::json& p = profile["stages"][st["stage"].get<size_t>()];
    EXPECT_GT(st["deferred_bytes"].get<int64_t>(), 0);
    EXPECT_DOUBLE_EQ(p["mem_act"].get<double>() * pf::kBytesPerMB, st["state_bytes"].get<double>());
    EXPECT_DOUBLE_EQ(p["mem_deferred"].get<double>() * pf::kBytesPerMB, st["deferred_bytes"].get<double>());
  }
  const pf_test::Launch planned =
      pf_test::run(std::string(PF_BINARY) + " plan --json --profile " + (prof / "profile.json").string());
  ASSERT_EQ(planned.status, 0) << planned.out;
  const nlohmann::json mem = nlohmann::json::parse(planned.out.substr(planned.out.find('{')))["memory"];
  int64_t peak = -1;
  for (const nlohmann::json& rank : held["ranks"])
    if (rank["device"].get<int>() == mem["worst_device"].get<int>()) peak = rank["peak_bytes"].get<int64_t>();
  EXPECT_NEAR(mem["activations_in_flight"].get<double>() * pf::kBytesPerMB, static_cast<double>(peak), 1e-3)
      << planned.out;
}

}  // namespace
