// Issue 50, item 15: `eval --init RUN` while the run writes and rotates its checkpoints (one kept,
// one written every step) reads the newest complete one there is, every time; before, the one it
// found was often removed before it was opened ("cannot open").
#include "cli.hpp"

namespace {

using namespace pf_test;

fs::path dir() { return work_dir("rotation"); }

}  // namespace

TEST(Rotation, EvalOfARunRotatingItsCheckpointsReadsTheNewest) {
  tiny_config(dir());
  const fs::path run_dir = dir() / "out-rotating";
  Job job(train_cmd(dir(), "rotating", "--steps 1000000 --set train.checkpoint_every=1 --set train.keep_checkpoints=1"));
  ASSERT_TRUE(job.until("step")) << job.out;
  int ok = 0;
  for (int k = 0; k < 20; ++k) {
    const Launch e = run(kEnv + kBinary + " eval --init " + run_dir.string() + " --json");
    EXPECT_EQ(e.status, 0) << "try " << k << ": " << e.out;
    ok += e.status == 0;
  }
  EXPECT_EQ(ok, 20);
  kill(job.pid, SIGKILL);
}
