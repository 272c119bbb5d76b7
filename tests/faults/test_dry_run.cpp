// Issue 50, item 3: `train --dry-run` never says yes to a run that would fail. It is the run's own
// set-up up to its first write (train/train_loop.hpp), so every refusal is the run's, with the
// same status and line: the probe's cases in one process and under mpirun, each run both ways
// (run_both_ways), each writing nothing. test_hardening.cpp and apps/test_train_cli.cpp run their
// refusals both ways too.
#include "../checkpoint/cli.hpp"

#include <algorithm>

namespace {

using namespace pf_test;

fs::path dir() {
  const fs::path d = work_dir("dry_run") / "dry-run";
  fs::create_directories(d);
  return d;
}

std::string tiny_train(const fs::path& out, const std::string& rest) {
  return kEnv + kBinary + " train --config " + (dir() / "tiny.toml").string() + " --set train.out_dir=" + out.string() +
         " " + rest;
}

std::string mpi_tiny_train(int np, const fs::path& out, const std::string& rest) {
  return kEnv + kPfrun + " -np " + std::to_string(np) + " " + kBinary + " train --config " +
         (dir() / "tiny.toml").string() + " --set train.out_dir=" + out.string() + " " + rest;
}

// Both ways: status 2, one line of pipefisher's naming `what` (mpirun adds its own); `out` not made.
void expect_refused_both_ways(const std::string& cmd, const std::string& what, const fs::path& out) {
  const Launch r = run_both_ways(cmd);
  EXPECT_EQ(r.status, 2) << cmd << "\n" << r.out;
  const std::string ours = pipefisher_lines(r.out);
  EXPECT_EQ(std::count(ours.begin(), ours.end(), '\n'), 1) << cmd << ": not one line\n" << r.out;
  EXPECT_TRUE(contains(r.out, what)) << cmd << ": expected '" << what << "'\n" << r.out;
  if (!out.empty()) EXPECT_FALSE(fs::exists(out)) << cmd << ": " << out << " was made";
}

// A finished 2-step run with its checkpoint, made once.
fs::path finished_run() {
  const fs::path run_dir = dir() / "orig";
  if (fs::exists(run_dir / "summary.json")) return run_dir;
  tiny_config(dir());
  const Launch r = run(tiny_train(run_dir, "--steps 2"));
  EXPECT_EQ(r.status, 0) << r.out;
  return run_dir;
}

}  // namespace

// The probe's one-process cases: what --resume names, outputs that are inputs or another's, a
// layout the runner refuses, the benchmark flags.
TEST(DryRun, RefusesInOneProcessWhatTheRunRefuses) {
  const fs::path orig = finished_run(), none = dir() / "none";
  const std::string log_before = slurp(orig / "log.jsonl");
  const std::string tiny = (dir() / "tiny.toml").string();
  // A truncated checkpoint: its only one, in a copy of the run.
  const fs::path cut = dir() / "cut";
  fs::remove_all(cut);
  fs::copy(orig, cut, fs::copy_options::recursive);
  fs::resize_file(cut / "checkpoints" / "step-000002" / "weights-stage-0.safetensors", 100);
  // A Hugging Face folder, and a file, as out_dir.
  const fs::path hf = dir() / "hf", file = dir() / "a-file";
  fs::create_directories(hf);
  fs::copy_file(orig / "config.json", hf / "config.json", fs::copy_options::overwrite_existing);
  fs::copy_file(orig / "model.safetensors", hf / "model.safetensors", fs::copy_options::overwrite_existing);
  std::ofstream(file) << "x";
  const struct {
    std::string cmd, what;
    fs::path out;
  } cases[] = {
      {tiny_train(none, "--resume " + (dir() / "missing").string()), "--resume", none},
      {tiny_train(orig, "--resume " + orig.string() + " --steps 4 --set model.layers=3"), "model.layers", ""},
      {tiny_train(orig, "--resume " + orig.string() + " --steps 4 --set train.seed=7"), "train.seed", ""},
      {kEnv + kBinary + " train --resume " + cut.string() + " --steps 4", "--resume", ""},
      {tiny_train(none, "--save " + tiny), "--save", none},
      {tiny_train(none, "--log-json " + (none / "log.jsonl").string()), "--log-json", none},
      {tiny_train(hf, ""), "train.out_dir: '" + hf.string() + "' is not empty and not a pipefisher run", ""},
      {tiny_train(file, ""), "train.out_dir", ""},
      {tiny_train(orig, "--set optim.lr=0.02"), "holds the outputs of another run", ""},
      {tiny_train(none, "--set train.checkpoint_dir=" + (orig / "checkpoints").string()), "train.checkpoint_dir", none},
      {tiny_train(none, "--set kfac.enabled=true --set kfac.placement=adaptive"), "kfac.placement", none},
      {tiny_train(none, "--bench-slow 0:nan"), "--bench-slow", none},
      {tiny_train(none, "--bench-jitter 1e30"), "--bench-jitter", none},
  };
  for (const auto& c : cases) expect_refused_both_ways(c.cmd, c.what, c.out);
  EXPECT_EQ(slurp(orig / "log.jsonl"), log_before) << "the run refused beside it wrote into it";
  EXPECT_EQ(slurp(hf / "config.json"), slurp(orig / "config.json"));
}

// Under mpirun: a world the layout does not fit, a plan profile that is no profile. In one
// process, the dry run of a 2-stage layout checks it as launched on 2 ranks: the same line.
TEST(DryRun, RefusesUnderMpirunWhatTheRunRefuses) {
  finished_run();
  const fs::path none = dir() / "none-mpi";
  const std::string stages2 = "--set parallel.stages=2 --steps 2";
  expect_refused_both_ways(mpi_tiny_train(3, none, stages2), "parallel.stages: the MPI world has 3 ranks", none);
  const std::string profile = stages2 + " --set kfac.enabled=true --set kfac.placement=bubbles --set kfac.plan_profile=" +
                              (dir() / "tiny.toml").string();
  expect_refused_both_ways(mpi_tiny_train(2, none, profile), "kfac.plan_profile", none);
  const Launch one = run(tiny_train(none, profile + " --dry-run"));
  EXPECT_EQ(one.status, 2) << one.out;
  EXPECT_TRUE(contains(one.out, "kfac.plan_profile: '" + (dir() / "tiny.toml").string() + "' is not JSON")) << one.out;
  EXPECT_FALSE(contains(one.out, "check out")) << one.out;
  // A dry run that passes prints its report once, not once per rank.
  const Launch ok = run(mpi_tiny_train(2, none, stages2 + " --dry-run"));
  EXPECT_EQ(ok.status, 0) << ok.out;
  size_t reports = 0;
  for (size_t at = ok.out.find("dry run: "); at != std::string::npos; at = ok.out.find("dry run: ", at + 1)) ++reports;
  EXPECT_EQ(reports, 1u) << ok.out;
  EXPECT_FALSE(fs::exists(none)) << "a dry run wrote its out_dir";
}

// Issue 50, item 13: the dry run's plan is made with every key the run plans with (before, the
// plan ignored them: refresh [2,2] where the run would use [7,7]).
TEST(DryRun, ThePlanReadsEveryKeyTheRunPlansWith) {
  finished_run();
  const fs::path none = dir() / "none-plan";
  const Launch r = run(tiny_train(none, "--set parallel.stages=2 --set kfac.enabled=true --set kfac.placement=bubbles "
                                        "--set kfac.min_refresh_steps=7 --set kfac.split_inversions=true "
                                        "--set parallel.recompute=true --dry-run"));
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* flag : {" --min-refresh-steps 7", " --split-to-shorten", " --recompute"})
    EXPECT_TRUE(contains(r.out, flag)) << flag << "\n" << r.out;
  const Launch zb = run(tiny_train(none, "--set parallel.stages=2 --set parallel.schedule=zb-auto "
                                         "--set parallel.zb_memory=2 --dry-run"));
  ASSERT_EQ(zb.status, 0) << zb.out;
  EXPECT_TRUE(contains(zb.out, " --zb-memory 2")) << zb.out;
  EXPECT_FALSE(fs::exists(none));
}

// Issue 50, item 6: optim.decay_steps below train.steps leaves the rate at its floor for the rest
// of the run: the run and its dry run warn, naming both keys; a decay as long as the run does not.
TEST(DryRun, ADecayShorterThanTheRunIsWarnedOf) {
  finished_run();
  const std::string warning = "pipefisher: warning: optim.decay_steps = 2 is below train.steps = 4: from step 3 on";
  for (const std::string dry : {" --dry-run", ""}) {
    const fs::path out = dir() / "decay";
    fs::remove_all(out);
    const Launch r = run(tiny_train(out, "--steps 4 --set optim.decay_steps=2" + dry));
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_TRUE(contains(r.out, warning)) << r.out;
    const Launch whole = run(tiny_train(dir() / "decay-whole", "--steps 4 --set optim.decay_steps=4 --dry-run"));
    EXPECT_FALSE(contains(whole.out, "optim.decay_steps")) << whole.out;
  }
}
