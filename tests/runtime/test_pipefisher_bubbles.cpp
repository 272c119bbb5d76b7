// PipeFisher in the bubbles equals single-process K-FAC following the run's refresh record
// (pipefisher_fixture.hpp: reference_following), for each schedule, with replicas, with
// recomputation and with BERT's NSP head.
#include "pipefisher_fixture.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <set>
#include <string>
#include <vector>

using namespace pf_test::pipefisher;

TEST(PipeFisherRuntime, BubblesEqualSingleProcessWithSamePattern) {
  expect_bubbles_match("gpipe", 2, "--set parallel.stages=2 --set parallel.schedule=gpipe", {});
  expect_bubbles_match("1f1b", 2, "--set parallel.stages=2 --set parallel.schedule=1f1b", {});
  expect_bubbles_match("interleaved", 2,
                       "--set parallel.stages=2 --set parallel.schedule=interleaved --set parallel.virtual_stages=2", {});
  expect_bubbles_match("zbh1", 2, "--set parallel.stages=2 --set parallel.schedule=zb-h1", {});
  expect_bubbles_match("zbh2", 2, "--set parallel.stages=2 --set parallel.schedule=zb-h2", {});
  expect_bubbles_match("1f1b_4", 4, "--set parallel.stages=4 --set parallel.schedule=1f1b", {});
}

// Data + inversion parallelism: 2 stages x 2 replicas, curvature summed and inverses broadcast
// at SYNC_CURV, the refreshed inverses in use one cycle later on every replica; with a free
// broadcast the replicas split each stage's precondition by layer and all-gather the results.
TEST(PipeFisherRuntime, BubblesWithTwoReplicasEqualSingleProcessWithSamePattern) {
  expect_bubbles_match("1f1b_2x2", 4,
                       "--set parallel.stages=2 --set parallel.schedule=1f1b --set parallel.data_parallel=2 "
                       "--set parallel.micro_batches=2",
                       {"parallel.data_parallel=2", "parallel.micro_batches=2"}, "--test-bcast-model 0,0");
}

// SPD-KFAC's Algorithm 1 over the replicas with a broadcast model fixed by the test hook: with
// ffn = 128, a 32-wide factor inverts in ~0.007 ms, a 128-wide one in ~0.15 ms (measured here,
// 1 thread); a broadcast of a flat 0.03 ms makes the 32-wide pieces NCT (every replica inverts
// them) and the 128-wide ones CT (the owner inverts and broadcasts them): both kinds in one run,
// and the replicas still end with single-process K-FAC's weights.
TEST(PipeFisherRuntime, BubblesWithTwoReplicasBroadcastAndLocalInversionsEqualSingleProcess) {
  Launched r = launch(4, "1f1b_2x2_place",
                      "--set parallel.stages=2 --set parallel.schedule=1f1b --set parallel.data_parallel=2 "
                      "--set parallel.micro_batches=2 --set model.ffn=128 --set kfac.placement=bubbles "
                      "--profile-dir " + (dir() / "1f1b_2x2_place_profile").string() + " --profile-steps 8",
                      "--test-bcast-model 0.03,0");
  ASSERT_EQ(r.status, 0) << r.out;
  // The plan's placement line: some pieces broadcast, some inverted on every replica.
  const auto at = r.out.find("inversion pieces:");
  ASSERT_NE(at, std::string::npos) << r.out;
  int ct = -1, nct = -1;
  ASSERT_EQ(std::sscanf(r.out.c_str() + at, "inversion pieces: %d broadcast, %d", &ct, &nct), 2) << r.out;
  EXPECT_GT(ct, 0) << r.out;
  EXPECT_GT(nct, 0) << r.out;
  // Its profile.json carries W and the broadcast model, so `plan --profile` alone places pieces
  // of both kinds too (Algorithm 1 on the same inversion times and model; the counts may differ
  // by a split: the file's durations are stage means, the runtime's plan used each action's).
  const fs::path prof = dir() / "1f1b_2x2_place_profile" / "profile.json";
  const nlohmann::json pj = read_json(prof);
  EXPECT_EQ(pj["run"]["replicas"], 2);
  EXPECT_NEAR(pj["broadcast"]["alpha"].get<double>(), 0.03, 1e-12);
  Launched p = pf_test::run(std::string(PF_BINARY) + " plan --json --profile " + prof.string());
  ASSERT_EQ(p.status, 0) << p.out;
  const nlohmann::json pl = nlohmann::json::parse(p.out.substr(p.out.find('{')));
  EXPECT_EQ(pl["data_parallel"], 2);
  EXPECT_NEAR(pl["kfac"]["bcast_alpha"].get<double>(), 0.03, 1e-12);
  int planned_ct = 0, planned_nct = 0;
  for (const auto& sp : pl["kfac"]["placement"]) {
    planned_ct += sp["communicated"].get<int>();
    planned_nct += sp["non_communicated"].get<int>();
  }
  EXPECT_GT(planned_ct, 0) << p.out;
  EXPECT_GT(planned_nct, 0) << p.out;
  std::ifstream f(dir() / "1f1b_2x2_place" / "kfac_refresh.json");
  const nlohmann::json rec = nlohmann::json::parse(f);
  pf::Config cfg = load_config({"parallel.data_parallel=2", "parallel.micro_batches=2", "model.ffn=128"});
  cfg.kfac.placement = pf::Placement::Inline;
  expect_close(saved_weights(dir() / "1f1b_2x2_place.safetensors"), reference_following(cfg, rec), "1f1b_2x2_place");
}

// Activation recomputation (parallel.recompute): the planner makes CURV_A wait for the backward
// that re-runs the forward (the A taps see only that run), so the refresh pattern may differ from
// the run without it; the weights equal single-process K-FAC following the run's own record.
TEST(PipeFisherRuntime, BubblesWithRecomputeEqualSingleProcessWithSamePattern) {
  expect_bubbles_match("1f1b_recompute", 2,
                       "--set parallel.stages=2 --set parallel.schedule=1f1b --set parallel.recompute=true", {});
  expect_bubbles_match("chimera_recompute", 2,
                       "--set parallel.stages=2 --set parallel.schedule=chimera --set train.steps=16 "
                       "--set parallel.recompute=true",
                       {"train.steps=16"}, "--test-kfac-cost-scale 0.0001");
}

// BERT's full pretraining loss: K-FAC preconditions the pooler and the NSP classifier too (their
// B factor with the NSP loss's own scale, 1/sequences), on the last stage, inline and in the bubbles.
TEST(PipeFisherRuntime, NextSentencePredictionHeadIsPreconditionedOnTheLastStage) {
  Launched r = launch(2, "nsp_inline", "--set parallel.stages=2 --set parallel.schedule=1f1b --set kfac.placement=inline "
                                       "--set data.nsp=true");
  ASSERT_EQ(r.status, 0) << r.out;
  expect_close(saved_weights(dir() / "nsp_inline.safetensors"),
               trainer_weights(load_config({"kfac.placement=inline", "data.nsp=true"})), "nsp_inline");
  expect_bubbles_match("nsp_bubbles", 2, "--set parallel.stages=2 --set parallel.schedule=1f1b --set data.nsp=true",
                       {"data.nsp=true"});
  const nlohmann::json rec = read_json(dir() / "nsp_bubbles" / "kfac_refresh.json");
  std::set<std::string> layers;
  for (const auto& e : rec["events"]) layers.insert(e["layer"].get<std::string>());
  EXPECT_TRUE(layers.count("bert.pooler.dense.weight")) << rec.dump(1);
  EXPECT_TRUE(layers.count("cls.seq_relationship.weight")) << rec.dump(1);
}

// The automatic zero-bubble orders: zb-auto at twice 1F1B's memory, and zb-v's two chunks per
// rank in a V (rank 0 holds the first stage and the last). Planned from made-up timings, so the
// refresh pattern (and a refresh within the run) does not depend on the machine's load.
TEST(PipeFisherRuntime, BubblesWithAutomaticZeroBubbleOrdersEqualSingleProcessWithSamePattern) {
  const std::string autos = "--set parallel.stages=2 --set parallel.schedule=zb-auto --set parallel.zb_memory=2";
  expect_bubbles_match("zbauto", 2, autos + " --set kfac.plan_profile=" + made_up_plan_profile("zbauto", autos, 2).string(),
                       {});
  const std::string v = "--set parallel.stages=2 --set parallel.schedule=zb-v";
  expect_bubbles_match("zbv", 2, v + " --set kfac.plan_profile=" + made_up_plan_profile("zbv", v, 2).string(), {});
}

// K-FAC in a zero-bubble schedule's bubbles with data + inversion parallelism: 2 stages x 2
// replicas of ZB-H1, curvature summed and inverses broadcast among the replicas.
TEST(PipeFisherRuntime, BubblesWithZeroBubbleAndTwoReplicasEqualSingleProcessWithSamePattern) {
  const std::string sets = "--set parallel.stages=2 --set parallel.schedule=zb-h1 --set parallel.data_parallel=2 "
                           "--set parallel.micro_batches=2";
  expect_bubbles_match("zbh1_2x2", 4, sets + " --set kfac.plan_profile=" + made_up_plan_profile("zbh1_2x2", sets, 4).string(),
                       {"parallel.data_parallel=2", "parallel.micro_batches=2"}, "--test-bcast-model 0,0");
}

// summary.json's "pipefisher_plan" is the plan the run printed last: its refresh cycle per
// device, and the planned step with K-FAC, without it and with the precondition alone (printed
// to 0.01 ms).
void expect_summary_has_the_plan(const std::string& out, const fs::path& summary) {
  const size_t at = out.rfind("pipefisher: planned from");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string line = out.substr(at, out.find('\n', at) - at);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      line, m, std::regex(R"(refresh every ([0-9 ]+) steps .* step ([0-9.]+) ms \(([0-9.]+) ms without K-FAC, ([0-9.]+) ms with)")))
      << line;
  std::vector<int> refresh;
  std::istringstream steps(m[1].str());
  for (int r; steps >> r;) refresh.push_back(r);
  const nlohmann::json plan = read_json(summary).at("pipefisher_plan");
  EXPECT_EQ(plan.at("refresh_steps_per_device").get<std::vector<int>>(), refresh) << plan.dump();
  EXPECT_NEAR(plan.at("planned_step_ms").get<double>(), std::stod(m[2].str()), 0.005) << line;
  EXPECT_NEAR(plan.at("planned_step_without_kfac_ms").get<double>(), std::stod(m[3].str()), 0.005) << line;
  EXPECT_NEAR(plan.at("planned_step_precondition_only_ms").get<double>(), std::stod(m[4].str()), 0.005) << line;
  // Three different steps: K-FAC's work costs something, the precondition alone part of it.
  EXPECT_LT(plan.at("planned_step_without_kfac_ms").get<double>(), plan.at("planned_step_precondition_only_ms").get<double>());
  EXPECT_LE(plan.at("planned_step_precondition_only_ms").get<double>(), plan.at("planned_step_ms").get<double>());
  EXPECT_GT(plan.at("utilization").get<double>(), 0) << plan.dump();
}

// The Llama-style model's seven Linears per block (q, k and v of two widths with grouped-query
// attention, o, gate, up, down) in the bubbles of 1F1B and Chimera, untied lm_head: every factor
// refreshed as the record says, single-process K-FAC's weights. Also inline K-FAC (the Trainer's).
TEST(PipeFisherRuntime, LlamaInTheBubblesAndInlineEqualSingleProcess) {
  const std::vector<std::string> model = {
      "model.arch=llama", "model.heads=4", "model.kv_heads=2", "model.ffn=48", "model.tie_embeddings=false",
      "data.vocab=gpt2", "data.train_file=" PF_SOURCE_DIR "/data/sample/moby-dick-1-20.gpt2.bin",
      "data.valid_file=" PF_SOURCE_DIR "/data/sample/moby-dick-1-20.gpt2.bin"};
  std::string sets;
  for (const std::string& s : model) sets += " --set " + s;
  std::string out;
  expect_bubbles_match("llama_1f1b", 2, "--set parallel.stages=2 --set parallel.schedule=1f1b" + sets, model, "", &out);
  expect_summary_has_the_plan(out, dir() / "llama_1f1b" / "summary.json");
  // Chimera's bubbles are short for seven Linears a block: its K-FAC costs are scaled down at
  // planning (as BubblesWithRecomputeEqualSingleProcessWithSamePattern's), or the plan's cycle
  // outlasts the run on a loaded machine and nothing would be refreshed from the plan.
  std::vector<std::string> longer = model;
  longer.push_back("train.steps=16");
  expect_bubbles_match("llama_chimera", 2, "--set parallel.stages=2 --set parallel.schedule=chimera --set train.steps=16" + sets,
                       longer, "--test-kfac-cost-scale 0.0001");
  const nlohmann::json rec = read_json(dir() / "llama_1f1b" / "kfac_refresh.json");
  std::set<std::string> layers;
  for (const auto& e : rec["events"]) layers.insert(e["layer"].get<std::string>());
  for (const char* l : {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
    EXPECT_TRUE(layers.count("model.layers.3.self_attn." + std::string(l) + ".weight") ||
                layers.count("model.layers.3.mlp." + std::string(l) + ".weight"))
        << l << "\n" << rec.dump(1);
  Launched r = launch(2, "llama_inline", "--set parallel.stages=2 --set kfac.placement=inline" + sets);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_FALSE(read_json(dir() / "llama_inline" / "summary.json").contains("pipefisher_plan"));  // no plan inline
  std::vector<std::string> inline_sets = model;
  inline_sets.push_back("kfac.placement=inline");
  expect_close(saved_weights(dir() / "llama_inline.safetensors"), trainer_weights(load_config(inline_sets)), "llama_inline");
}
