// Issue 20 items 4 and 7 at the command line. A run stopped at any point (a signal during its last
// step or its final evaluation, a kill during its final writes) finishes with --resume, ending with
// the files of an uninterrupted run and its weights to the bit. --overwrite removes the previous
// run's outputs, so that a new run stopped early is not mistaken for the old one. The signals land
// at chosen moments through train's hidden --test-signal flag (train/test_seams.hpp), not by timing.
#include "../checkpoint/cli.hpp"

#include "io/checkpoint.hpp"

#include <signal.h>

#include <set>

namespace {

using namespace pf_test;

fs::path dir() { return work_dir("faults"); }

// The names of the regular files directly in `d`.
std::set<std::string> files_in(const fs::path& d) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(d))
    if (e.is_regular_file()) names.insert(e.path().filename().string());
  return names;
}

std::string bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

nlohmann::json json_file(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

// Run `name` ended as run `ref` did: the same files in out_dir, the same weights to the bit, the
// same summary and the same log records (but `cut_eval`'s validation loss: a stop cut that
// evaluation short, and the resumed run's final evaluation made it again for summary.json).
void expect_finished_like(const std::string& name, const std::string& ref, int64_t cut_eval = 0) {
  const fs::path a = dir() / ("out-" + ref), b = dir() / ("out-" + name);
  EXPECT_EQ(files_in(b), files_in(a)) << name;
  EXPECT_EQ(bytes(b / "model.safetensors"), bytes(a / "model.safetensors")) << name << ": the final weights differ";
  EXPECT_EQ(bytes(b / "config.json"), bytes(a / "config.json")) << name;
  ASSERT_TRUE(fs::exists(b / "summary.json")) << name;
  const nlohmann::json x = json_file(a / "summary.json"), y = json_file(b / "summary.json");
  for (const char* key : {"steps", "first_loss", "final_loss", "final_valid_loss", "tokens"})
    EXPECT_EQ(y[key], x[key]) << name << ": summary.json's " << key;
  const auto la = read_log(dir() / (ref + ".jsonl")), lb = read_log(dir() / (name + ".jsonl"));
  ASSERT_EQ(lb.size(), la.size()) << name;
  for (const auto& [step, j] : la) {
    EXPECT_EQ(lb.at(step)["loss"], j["loss"]) << name << " step " << step;
    if (step != cut_eval)
      EXPECT_EQ(lb.at(step).contains("valid_loss"), j.contains("valid_loss")) << name << " step " << step;
  }
}

// The run `name` stopped on SIGTERM after its last step (6): its checkpoint is at step 6 and it has
// no final outputs; --resume writes them.
void expect_stopped_at_the_end_then_finished(const Launch& stopped, const std::string& name, const fs::path& ck,
                                             int np, const std::string& sets, const std::string& ref,
                                             int64_t cut_eval = 0) {
  if (np == 1) EXPECT_EQ(stopped.status, 128 + SIGTERM) << stopped.out;
  EXPECT_NE(stopped.status, 0) << stopped.out;
  EXPECT_TRUE(contains(stopped.out, "pipefisher train: SIGTERM after step 6: checkpoint written to " +
                                        pf::checkpoint_step_dir(ck.string(), 6))) << stopped.out;
  EXPECT_FALSE(fs::exists(dir() / ("out-" + name) / "summary.json")) << name;
  const std::string resume = sets + " --resume " + ck.string();
  Launch resumed = run(np == 1 ? train_cmd(dir(), name, resume) : mpi_train_cmd(np, dir(), name, resume));
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  EXPECT_TRUE(contains(resumed.out, "its run's 6 steps are done: the final evaluation and outputs follow")) << resumed.out;
  expect_finished_like(name, ref, cut_eval);
}

TEST(Stops, ASignalDuringTheLastStepOrTheFinalEvaluationFinishesOnResume) {
  tiny_config(dir());
  Launch whole = run(train_cmd(dir(), "whole", ""));
  ASSERT_EQ(whole.status, 0) << whole.out;
  for (const std::string where : {"step:6", "eval:6"}) {
    const std::string name = "last-" + where.substr(0, 4);
    const fs::path ck = dir() / (name + "-ckpt");
    const std::string sets = "--set train.checkpoint_dir=" + ck.string();
    Launch stopped = run(train_cmd(dir(), name, sets + " --test-signal TERM@" + where));
    // Either way step 6's evaluation is cut (a pending stop ends an evaluation at once); the
    // resumed run's final evaluation makes it again for summary.json.
    expect_stopped_at_the_end_then_finished(stopped, name, ck, 1, sets, "whole", 6);
  }
}

TEST(Stops, UnderMpirunASignalDuringTheLastStepFinishesOnResume) {
  tiny_config(dir());
  const std::string two = "--set parallel.stages=2";
  Launch whole = run(mpi_train_cmd(2, dir(), "whole2", two));
  ASSERT_EQ(whole.status, 0) << whole.out;
  const fs::path ck = dir() / "last2-ckpt";
  const std::string sets = two + " --set train.checkpoint_dir=" + ck.string();
  Launch stopped = run(mpi_train_cmd(2, dir(), "last2", sets + " --test-signal TERM@step:6"));
  expect_stopped_at_the_end_then_finished(stopped, "last2", ck, 2, sets, "whole2", 6);
}

// A kill during the final writes (model.safetensors written, summary.json not) of a run whose last
// checkpoint is at its end: --resume writes the final outputs. A first SIGTERM there lets the
// writes complete.
TEST(Stops, AKillDuringTheFinalWritesFinishesOnResume) {
  tiny_config(dir());
  Launch whole = run(train_cmd(dir(), "whole", ""));
  ASSERT_EQ(whole.status, 0) << whole.out;
  const fs::path ck = dir() / "killfw-ckpt";
  const std::string sets = "--set train.checkpoint_every=3 --set train.checkpoint_dir=" + ck.string();
  Launch killed = run(train_cmd(dir(), "killfw", sets + " --test-signal KILL@final-writes"));
  EXPECT_TRUE(killed.status == -1 || killed.status == 128 + SIGKILL) << killed.status << "\n" << killed.out;
  EXPECT_TRUE(fs::exists(dir() / "out-killfw" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir() / "out-killfw" / "summary.json"));
  Launch resumed = run(train_cmd(dir(), "killfw", sets + " --resume " + ck.string()));
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  EXPECT_TRUE(contains(resumed.out, "resuming from " + pf::checkpoint_step_dir(ck.string(), 6))) << resumed.out;
  expect_finished_like("killfw", "whole");

  Launch term = run(train_cmd(dir(), "termfw", "--test-signal TERM@final-writes"));
  EXPECT_EQ(term.status, 0) << term.out;
  EXPECT_TRUE(contains(term.out, "pipefisher train: SIGTERM after the last step: the final outputs were written, the "
                                 "run is complete")) << term.out;
  expect_finished_like("termfw", "whole");
}

// Item 7: with --overwrite the previous run's outputs (model, summary, logs, the checkpoints of
// out_dir/checkpoints) go before the new run writes, so a new run stopped early leaves only its own.
TEST(Stops, OverwriteRemovesThePreviousRunsOutputs) {
  tiny_config(dir());
  const fs::path out = dir() / "out-ow", ck = out / "checkpoints";
  Launch a = run(train_cmd(dir(), "ow", "--set train.checkpoint_every=3 --set train.checkpoint_dir=" + ck.string()));
  ASSERT_EQ(a.status, 0) << a.out;
  ASSERT_TRUE(fs::exists(out / "summary.json") && fs::exists(ck / "step-000006"));
  Launch b = run(train_cmd(dir(), "ow", "--set optim.lr=3e-3 --overwrite --test-signal TERM@step:2"));
  EXPECT_EQ(b.status, 128 + SIGTERM) << b.out;
  for (const char* gone : {"model.safetensors", "config.json", "summary.json"})
    EXPECT_FALSE(fs::exists(out / gone)) << gone << ": the previous run's, left beside the new run's log";
  EXPECT_TRUE(contains(bytes(out / "config.toml"), "lr = 0.003"));
  EXPECT_EQ(read_log(out / "log.jsonl").size(), 2u);
  EXPECT_FALSE(fs::exists(ck / "step-000003")) << "the previous run's checkpoint";
  EXPECT_FALSE(fs::exists(ck / "step-000006")) << "the previous run's checkpoint";
  EXPECT_EQ(pf::find_latest_checkpoint(ck.string()), pf::checkpoint_step_dir(ck.string(), 2));
  // Without --overwrite, a run with another config is still refused and removes nothing.
  Launch c = run(train_cmd(dir(), "ow", "--set optim.lr=1e-3"));
  EXPECT_EQ(c.status, 2) << c.out;
  EXPECT_TRUE(fs::exists(ck / "step-000002"));
  EXPECT_EQ(read_log(out / "log.jsonl").size(), 2u);
}

}  // namespace

// Issue 50, item 9: a stop signal during an evaluation ends it within a micro-batch. SIGINT at the
// start of a long evaluation (150 held-out micro-batches of a wider model) stops the run in
// seconds with status 130 and its checkpoint; the cut evaluation is not logged as a loss.
TEST(Stops, ASignalDuringAnEvaluationEndsItWithinAMicroBatch) {
  tiny_config(dir());
  const std::string wide = "--set model.hidden=256 --set model.ffn=1024 --set model.heads=4 --set model.seq_len=128 "
                           "--set model.max_position=128 --set train.eval_batches=150 --set train.eval_every=1 "
                           "--set train.steps=2 --set train.checkpoint_every=0 ";
  for (const int np : {1, 2}) {
    const std::string name = "cut-eval-" + std::to_string(np);
    const std::string sets = wide + (np == 2 ? "--set parallel.stages=2 " : "") + "--test-signal INT@eval:1";
    Launch r = run(np == 1 ? train_cmd(dir(), name, sets) : mpi_train_cmd(2, dir(), name, sets));
    EXPECT_NE(r.status, 0) << r.out;
    if (np == 1) EXPECT_EQ(r.status, 128 + SIGINT) << r.out;
    EXPECT_TRUE(contains(r.out, "pipefisher train: SIGINT after step 1")) << r.out;
    const auto log = read_log(dir() / (name + ".jsonl"));
    ASSERT_EQ(log.size(), 1u) << r.out;
    EXPECT_FALSE(log.at(1).contains("valid_loss")) << "the cut evaluation was logged";
    EXPECT_LT(r.seconds, 60) << "the evaluation was not cut short";
  }
}

// Issue 50, item 12: Ctrl-C (SIGINT to pfrun's process group) during a 2-rank training stops it
// as SIGUSR1 to mpirun does: every rank after its step, a checkpoint, the line saying how to
// continue, and status 130 (before: mpirun killed the ranks, exit 1, no line). SIGTERM to pfrun
// alike, 143. The run resumes.
TEST(Stops, CtrlCUnderPfrunStopsWithACheckpointAndSaysHowToContinue) {
  tiny_config(dir());
  for (const int sig : {SIGINT, SIGTERM}) {
    const std::string name = sig == SIGINT ? "ctrl-c" : "pfrun-term";
    const fs::path ck = dir() / (name + "-ckpt");
    Job job(kEnv + "setsid " + kPfrun + " -np 2 " + kBinary + " train --config " + (dir() / "tiny.toml").string() +
            " --set parallel.stages=2 --steps 100000 --set train.checkpoint_every=1000 --set train.checkpoint_dir=" +
            ck.string() + " --set train.out_dir=" + (dir() / ("out-" + name)).string());
    ASSERT_TRUE(job.until("step     10/")) << job.out;
    ASSERT_EQ(sig == SIGINT ? kill(-job.pid, sig) : kill(job.pid, sig), 0);
    EXPECT_EQ(job.finish(), 128 + sig) << job.out;
    EXPECT_TRUE(contains(job.out, ": checkpoint written to ")) << job.out;
    EXPECT_TRUE(contains(job.out, "continue with --resume " + ck.string())) << job.out;
    const pf::CheckpointManifest m = pf::read_checkpoint(pf::find_latest_checkpoint(ck.string()));
    EXPECT_GE(m.step, 10);
    Launch r = run(mpi_train_cmd(2, dir(), name + "2", "--set parallel.stages=2 --steps " + std::to_string(m.step + 1) +
                                                       " --resume " + ck.string()));
    EXPECT_EQ(r.status, 0) << r.out;
  }
}
