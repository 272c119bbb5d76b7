// kfac.placement = replay (train/kfac_replay.hpp): one process following a PipeFisher run's
// refresh record trains the pipeline's weights, to the tolerance of the bubbles tests
// (pipefisher_fixture.hpp: 1e-5, float32 sums in another order), also past the record's end,
// where its last period repeats. The pipeline runs plan from made-up timings, so what they
// refresh does not depend on the machine's load. A record of another shape, or one that cannot
// be followed that far, is refused naming the key; a replay resumes bit for bit.
#include "pipefisher_fixture.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <string>

using namespace pf_test::pipefisher;

namespace {

std::string steps(int n) { return " --set train.steps=" + std::to_string(n); }

// One process (no mpirun) following `record`.
Launched replay(const std::string& name, const fs::path& record, const std::string& sets) {
  return pf_test::run("OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 " PF_BINARY " train --config " + config_file().string() +
                      " --set train.out_dir=" + (dir() / name).string() + " --save " +
                      (dir() / (name + ".safetensors")).string() +
                      " --set kfac.placement=replay --set kfac.refresh_record=" + record.string() + " " + sets);
}

// A bubbles run planned from `profile`; its refresh record.
fs::path bubbles_run(const std::string& name, int ranks, const std::string& sets, const fs::path& profile) {
  Launched r = launch(ranks, name, sets + " --set kfac.placement=bubbles --set kfac.replan_on_drift=false " +
                      "--set kfac.plan_profile=" + profile.string());
  EXPECT_EQ(r.status, 0) << r.out;
  return dir() / name / "kfac_refresh.json";
}

// The record of a `short_steps` run, followed for `long_steps` by one process, against the
// pipeline's own `long_steps` run of the same plan.
void expect_replay_equals_pipeline(const std::string& name, int ranks, const std::string& layout, int short_steps,
                                   int long_steps) {
  const fs::path profile = made_up_plan_profile(name, layout, ranks);
  const fs::path record = bubbles_run(name + "_short", ranks, layout + steps(short_steps), profile);
  bubbles_run(name + "_long", ranks, layout + steps(long_steps), profile);
  const nlohmann::json rec = read_json(record);
  int stale = 0;
  for (const auto& e : rec["events"]) stale += e["use_step"].get<int64_t>() > e["curv_step"].get<int64_t>();
  EXPECT_GT(stale, 0) << rec.dump(1);  // the plan's inverses are used after the step that built them
  ASSERT_EQ(rec["steps"].get<int>(), short_steps);
  Launched r = replay(name + "_replay", record, steps(long_steps));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("repeated past its end"), std::string::npos) << r.out;
  expect_close(saved_weights(dir() / (name + "_replay.safetensors")), saved_weights(dir() / (name + "_long.safetensors")),
               name);
}

const std::string k1F1B = "--set parallel.stages=2 --set parallel.schedule=1f1b";

fs::path made_up_1f1b_profile() {
  static const fs::path profile = made_up_plan_profile("replay_rec", k1F1B, 2);
  return profile;
}

fs::path short_1f1b_record() {
  static const fs::path record = bubbles_run("replay_rec", 2, k1F1B + steps(16), made_up_1f1b_profile());
  return record;
}

std::map<int64_t, nlohmann::json> log_by_step(const fs::path& log) {
  std::map<int64_t, nlohmann::json> out;
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    out[j.at("step").get<int64_t>()] = j;
  }
  return out;
}

void expect_refused(const std::string& name, const fs::path& record, const std::string& sets, const std::string& key) {
  Launched r = replay(name, record, sets);
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find(key + ":"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir() / name)) << name << ": a refused run wrote its out_dir";
}

}  // namespace

TEST(PipeFisherReplay, OneProcessTrainsThe1F1BPipelinesWeights) {
  expect_replay_equals_pipeline("replay_1f1b", 2, "--set parallel.stages=2 --set parallel.schedule=1f1b", 16, 32);
}

TEST(PipeFisherReplay, OneProcessTrainsTheChimeraPipelinesWeights) {
  expect_replay_equals_pipeline("replay_chimera", 2, "--set parallel.stages=2 --set parallel.schedule=chimera", 16, 32);
}

TEST(PipeFisherReplay, ARecordOfAnotherShapeIsRefusedNamingTheKey) {
  const fs::path record = short_1f1b_record();
  expect_refused("replay_hidden", record, "--set model.hidden=64", "model.hidden");
  expect_refused("replay_mbs", record, "--set parallel.micro_batch_size=4", "parallel.micro_batch_size");
  expect_refused("replay_mb", record, "--set parallel.micro_batches=2", "parallel.micro_batches");
  expect_refused("replay_nsp", record, "--set data.nsp=true", "data.nsp");
}

TEST(PipeFisherReplay, ARecordThatCannotBeFollowedThatFarIsRefused) {
  const fs::path record = short_1f1b_record();
  // Its last period changed: the pattern cannot be extended.
  nlohmann::json rec = read_json(record);
  rec["events"].erase(rec["events"].size() - 1);
  const fs::path cut = dir() / "replay_cut.json";
  std::ofstream(cut) << rec.dump();
  expect_refused("replay_cut", cut, steps(24), "kfac.refresh_record");
  // Within its own steps it is followed as it is.
  EXPECT_EQ(replay("replay_cut_within", cut, steps(16)).status, 0);
  // Too short for two periods after planning.
  const fs::path tiny = bubbles_run("replay_tiny", 2, k1F1B + steps(3), made_up_1f1b_profile());
  expect_refused("replay_too_short", tiny, steps(24), "kfac.refresh_record");
  // Not a record at all, and the keys that need each other.
  expect_refused("replay_not_record", config_file(), "", "kfac.refresh_record");
  Launched no_record = pf_test::run(PF_BINARY " train --config " + config_file().string() +
                                    " --set kfac.placement=replay --set train.out_dir=" + (dir() / "replay_none").string());
  EXPECT_EQ(no_record.status, 2) << no_record.out;
  EXPECT_NE(no_record.out.find("precond.refresh_record: precond.placement = replay"), std::string::npos) << no_record.out;
  expect_refused("replay_stages", record, "--set parallel.stages=2", "kfac.placement");
  Launched stray = pf_test::run(PF_BINARY " train --config " + config_file().string() + " --set kfac.refresh_record=" +
                                record.string() + " --set train.out_dir=" + (dir() / "replay_stray").string());
  EXPECT_EQ(stray.status, 2) << stray.out;
  EXPECT_NE(stray.out.find("precond.refresh_record: only applies"), std::string::npos) << stray.out;
}

// Checkpoints carry the factors the replay keeps for later inversions: a resumed replay's steps
// equal an uninterrupted one's to the bit.
TEST(PipeFisherReplay, ResumeIsBitIdentical) {
  const fs::path record = short_1f1b_record();
  Launched whole = replay("replay_whole", record, steps(24));
  ASSERT_EQ(whole.status, 0) << whole.out;
  const fs::path ck = dir() / "replay_ck";
  const std::string ckset = steps(24) + " --set train.checkpoint_dir=" + ck.string() +
                            " --set train.checkpoint_every=7 --set train.keep_checkpoints=0";
  Launched first = replay("replay_first", record, ckset);
  ASSERT_EQ(first.status, 0) << first.out;
  ASSERT_TRUE(fs::exists(ck / "step-000007" / "manifest.json"));
  for (const char* later : {"step-000014", "step-000021", "step-000024"}) fs::remove_all(ck / later);
  // Another run directory, so its own checkpoint directory (ck belongs to the first run's).
  Launched resumed = replay("replay_resumed", record,
                            ckset + " --resume " + ck.string() + " --set train.checkpoint_dir=" + ck.string() + "2");
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  const auto want = log_by_step(dir() / "replay_whole" / "log.jsonl");
  const auto got = log_by_step(dir() / "replay_resumed" / "log.jsonl");
  int compared = 0;
  for (const auto& [s, j] : got) {
    if (s <= 7) continue;
    EXPECT_EQ(j.at("loss").get<double>(), want.at(s).at("loss").get<double>()) << "step " << s;
    EXPECT_EQ(j.at("grad_norm").get<double>(), want.at(s).at("grad_norm").get<double>()) << "step " << s;
    ++compared;
  }
  EXPECT_EQ(compared, 17);
}
