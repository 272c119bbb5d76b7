// Checkpoints by default and auto-resume (issue 22, item 2), at the command line: checkpoints go
// to out_dir/checkpoints without train.checkpoint_dir, the newest train.keep_checkpoints kept, one
// after the last step; train.checkpoint_every = 0 says it writes none. The same command run again
// continues its run, with a larger train.steps extends it, to the bits of one uninterrupted run
// (one process and a 2-rank pipeline); a contradicting configuration is refused naming both values,
// and writes nothing.
#include "cli.hpp"

#include <iterator>
#include <map>

namespace {

using namespace pf_test;

fs::path dir() { return work_dir("auto_resume"); }

std::string bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The step directories of a checkpoint directory, sorted.
std::vector<std::string> step_dirs(const fs::path& ck) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(ck))
    if (e.path().filename().string().rfind("step-", 0) == 0) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Every file under `root` and its bytes.
std::map<std::string, std::string> tree(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root))
    out[fs::relative(e.path(), root).string()] = e.is_regular_file() ? bytes(e.path()) : "(dir)";
  return out;
}

TEST(AutoResume, CheckpointsGoToOutDirKeepingTheNewestK) {
  tiny_config(dir());
  // The case: checkpoint_every without checkpoint_dir.
  Launch three = run(train_cmd(dir(), "keep3", "--set train.checkpoint_every=1 --set train.keep_checkpoints=3"));
  ASSERT_EQ(three.status, 0) << three.out;
  EXPECT_EQ(step_dirs(dir() / "out-keep3" / "checkpoints"),
            (std::vector<std::string>{"step-000004", "step-000005", "step-000006"}));
  EXPECT_EQ(bytes(dir() / "out-keep3" / "checkpoints" / "latest"), "step-000006\n");
  Launch all = run(train_cmd(dir(), "keep0", "--set train.checkpoint_every=2 --set train.keep_checkpoints=0"));
  ASSERT_EQ(all.status, 0) << all.out;
  EXPECT_EQ(step_dirs(dir() / "out-keep0" / "checkpoints"),
            (std::vector<std::string>{"step-000002", "step-000004", "step-000006"}));
  // The default cadence (100 steps) and the last step: a 6-step run ends with one checkpoint.
  Launch dflt = run(train_cmd(dir(), "default", ""));
  ASSERT_EQ(dflt.status, 0) << dflt.out;
  EXPECT_EQ(step_dirs(dir() / "out-default" / "checkpoints"), (std::vector<std::string>{"step-000006"}));
  // Off: said, and no checkpoint directory.
  Launch off = run(train_cmd(dir(), "off", "--set train.checkpoint_every=0"));
  ASSERT_EQ(off.status, 0) << off.out;
  EXPECT_TRUE(contains(off.out, "pipefisher train: checkpoints are off (train.checkpoint_every = 0)")) << off.out;
  EXPECT_FALSE(fs::exists(dir() / "out-off" / "checkpoints"));
}

// Runs `name` for 3 steps, then the same command with 6 steps, and expects the continued run's
// log and weights to be those of `ref`, 6 steps in one go. optim.decay_steps = 6: a schedule that
// does not depend on train.steps (by default the 3-step run's rate decays to 0 at its end).
void expect_extension_identical(const std::string& name, int np, const std::string& sets) {
  const std::string s = "--set optim.decay_steps=6 --set train.checkpoint_every=2 " + sets;
  auto cmd = [&](const std::string& n, const std::string& extra) {
    return np == 1 ? train_cmd(dir(), n, s + extra) : mpi_train_cmd(np, dir(), n, s + extra);
  };
  Launch ref = run(cmd(name + "-ref", " --steps 6"));
  ASSERT_EQ(ref.status, 0) << ref.out;
  Launch first = run(cmd(name, " --steps 3"));
  ASSERT_EQ(first.status, 0) << first.out;
  const fs::path out = dir() / ("out-" + name), ck = out / "checkpoints";
  ASSERT_EQ(step_dirs(ck), (std::vector<std::string>{"step-000002", "step-000003"}));
  Launch more = run(cmd(name, " --steps 6"));
  ASSERT_EQ(more.status, 0) << more.out;
  EXPECT_TRUE(contains(more.out, "resuming from " + (ck / "step-000003").string() + " (step 3): the run in " +
                                     out.string() + " continues (--overwrite starts it over)\n")) << more.out;
  const auto want = read_log(dir() / ("out-" + name + "-ref") / "log.jsonl"), got = read_log(out / "log.jsonl");
  ASSERT_EQ(got.size(), 6u);
  for (int64_t st = 1; st <= 6; ++st) {
    EXPECT_EQ(got.at(st)["loss"].get<double>(), want.at(st)["loss"].get<double>()) << name << " step " << st;
    EXPECT_EQ(got.at(st)["grad_norm"].get<double>(), want.at(st)["grad_norm"].get<double>()) << name << " step " << st;
  }
  EXPECT_EQ(bytes(out / "model.safetensors"), bytes(dir() / ("out-" + name + "-ref") / "model.safetensors")) << name;
  // A stopped run: the same command again finishes it, to the same bits.
  Launch stopped = run(cmd(name + "-stop", " --steps 6 --test-signal TERM@step:5"));
  ASSERT_EQ(stopped.status, 128 + SIGTERM) << stopped.out;
  Launch again = run(cmd(name + "-stop", " --steps 6"));
  ASSERT_EQ(again.status, 0) << again.out;
  EXPECT_TRUE(contains(again.out, " (step 5): the run in ")) << again.out;
  EXPECT_EQ(bytes(dir() / ("out-" + name + "-stop") / "model.safetensors"),
            bytes(dir() / ("out-" + name + "-ref") / "model.safetensors")) << name;
}

TEST(AutoResume, TheSameCommandWithMoreStepsExtendsTheRunBitExactly) {
  tiny_config(dir());
  expect_extension_identical("ext1", 1, "");
}

TEST(AutoResume, TwoStagePipelineExtendsBitExactly) {
  tiny_config(dir());
  expect_extension_identical("ext2", 2, "--set parallel.stages=2");
}

// Only what changes the training refuses (issue 35, item 7): new outputs (--log-json elsewhere),
// another thread count and other logging, evaluation and checkpoint cadences continue the run.
TEST(AutoResume, NewOutputsThreadsAndCadencesContinueTheRun) {
  tiny_config(dir());
  const std::string s = "--set optim.decay_steps=6 --set train.checkpoint_every=2 ";
  Launch first = run(train_cmd(dir(), "outs", s + "--steps 3"));
  ASSERT_EQ(first.status, 0) << first.out;
  EXPECT_TRUE(contains(first.out, "tokens/step (1 replica x 4 micro-batches x 2 sequences of 16 tokens)")) << first.out;
  const fs::path out = dir() / "out-outs", other = dir() / "other.jsonl";
  const auto before = read_log(out / "log.jsonl");
  Launch more = run(kEnv + kBinary + " train --config " + (dir() / "tiny.toml").string() + " --set train.out_dir=" +
                    out.string() + " --log-json " + other.string() + " " + s +
                    "--steps 6 --set train.threads=2 --set train.log_every=2 --set train.eval_every=2 "
                    "--set train.keep_checkpoints=1 --set train.checkpoint_every=3");
  ASSERT_EQ(more.status, 0) << more.out;
  EXPECT_TRUE(contains(more.out, " (step 3): the run in " + out.string() + " continues")) << more.out;
  const auto after = read_log(out / "log.jsonl");
  ASSERT_EQ(after.size(), 6u);
  for (int64_t st = 1; st <= 3; ++st) EXPECT_EQ(after.at(st), before.at(st)) << "step " << st << " kept as it was";
  EXPECT_EQ(read_log(other).rbegin()->first, 6) << "the new --log-json file has the new steps";
  EXPECT_EQ(step_dirs(out / "checkpoints"), (std::vector<std::string>{"step-000006"}));
}

// A larger train.steps without optim.decay_steps continues on the schedule of the longer run.
TEST(AutoResume, ExtendingSaysWhichScheduleItFollows) {
  tiny_config(dir());
  ASSERT_EQ(run(train_cmd(dir(), "sched", "--steps 3")).status, 0);
  Launch more = run(train_cmd(dir(), "sched", "--steps 6"));
  ASSERT_EQ(more.status, 0) << more.out;
  EXPECT_TRUE(contains(more.out, "train.checkpoint_dir: train.steps = 6 extends the checkpoint's run of 3 steps: from "
                                 "here the learning rate follows the schedule of a run of 6 steps")) << more.out;
  EXPECT_GT(read_log(dir() / "out-sched" / "log.jsonl").at(4)["lr"].get<double>(), 0.0);
}

// The guard names the first key that differs, with both values; a refused run writes nothing.
TEST(AutoResume, AContradictingConfigIsRefusedWithBothValues) {
  tiny_config(dir());
  const fs::path out = dir() / "out-guard";
  ASSERT_EQ(run(train_cmd(dir(), "guard", "")).status, 0);
  const auto before = tree(out);
  Launch seed = run(train_cmd(dir(), "guard", "--set train.seed=7 --steps 9"));
  EXPECT_EQ(seed.status, 2) << seed.out;
  EXPECT_TRUE(contains(seed.out, "pipefisher: train.out_dir: '" + out.string() + "' holds the outputs of another run "
                                 "(its config.toml differs at '[train] seed': run has 42, this command 7); give this "
                                 "run its own train.out_dir, or --overwrite to replace them\n")) << seed.out;
  EXPECT_EQ(tree(out), before) << "a refused run changed out_dir";
  // Without a checkpoint to continue from, a changed length is another run too.
  const fs::path off = dir() / "out-guard-off";
  ASSERT_EQ(run(train_cmd(dir(), "guard-off", "--set train.checkpoint_every=0 --steps 5")).status, 0);
  const auto off_before = tree(off);
  Launch longer = run(train_cmd(dir(), "guard-off", "--set train.checkpoint_every=0 --steps 6"));
  EXPECT_EQ(longer.status, 2) << longer.out;
  EXPECT_TRUE(contains(longer.out, "differs at '[train] steps': run has 5, this command 6) and no checkpoint in '" +
                                       (off / "checkpoints").string() + "' to continue it from")) << longer.out;
  EXPECT_EQ(tree(off), off_before) << "a refused run changed out_dir";
  // --overwrite starts over.
  Launch fresh = run(train_cmd(dir(), "guard", "--overwrite"));
  ASSERT_EQ(fresh.status, 0) << fresh.out;
  EXPECT_FALSE(contains(fresh.out, "resuming from")) << fresh.out;
}

// [precond]'s keys were kfac.* (issue 48): a run directory whose config.toml an older build wrote
// with [kfac] placement continues under the new names, and one written now continues under the
// old names; another value is still another run.
TEST(AutoResume, ARunWhoseConfigTomlHasTheOldKeyNamesContinues) {
  tiny_config(dir());
  const std::string s = "--set optim.decay_steps=6 --set train.checkpoint_every=2 --set kfac.enabled=true ";
  ASSERT_EQ(run(train_cmd(dir(), "alias", s + "--set precond.placement=skip --steps 3")).status, 0);
  const fs::path out = dir() / "out-alias", toml = out / "config.toml";
  // config.toml as an older build wrote it: the [precond] keys in [kfac] under their old names.
  std::string text = bytes(toml);
  const size_t at = text.find("[precond]\n"), end = text.find("\n[", at + 1);
  ASSERT_NE(at, std::string::npos) << text;
  const std::string block = text.substr(at + 10, end - at - 10);
  text = text.substr(0, at) + text.substr(end + 1);
  text.insert(text.find("[kfac]\n") + 7, block);
  ASSERT_NE(text.find("[kfac]\nmax_refresh_steps = 0\nmin_refresh_steps = 1\nplacement = 'skip'\n"), std::string::npos)
      << text;
  std::ofstream(toml) << text;
  Launch more = run(train_cmd(dir(), "alias", s + "--set precond.placement=skip --steps 4"));
  ASSERT_EQ(more.status, 0) << more.out;
  EXPECT_TRUE(contains(more.out, " (step 3): the run in " + out.string() + " continues")) << more.out;
  EXPECT_NE(bytes(toml).find("[precond]\n"), std::string::npos) << "rewritten with the new names";
  Launch old_names = run(train_cmd(dir(), "alias", s + "--set kfac.placement=skip --steps 5"));
  ASSERT_EQ(old_names.status, 0) << old_names.out;
  EXPECT_TRUE(contains(old_names.out, " (step 4): the run in " + out.string() + " continues")) << old_names.out;
  Launch other = run(train_cmd(dir(), "alias", s + "--set kfac.placement=inline --steps 6"));
  EXPECT_EQ(other.status, 2) << other.out;
  EXPECT_TRUE(contains(other.out, "its config.toml differs at '[precond] placement': run has 'skip', this command "
                                  "'inline'")) << other.out;
}

}  // namespace
