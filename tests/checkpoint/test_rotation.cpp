// Issue 50, item 15: `eval --init RUN` while the run writes and rotates its checkpoints (one kept,
// one written every step) reads the newest complete one there is, or says that a run is writing
// there; before, the one it found was often removed before it was opened ("cannot open").
#include "cli.hpp"

#include <chrono>
#include <thread>

namespace {

using namespace pf_test;

fs::path dir() { return work_dir("rotation"); }

}  // namespace

TEST(Rotation, EvalOfARunRotatingItsCheckpointsReadsTheNewest) {
  tiny_config(dir());
  const fs::path run_dir = dir() / "out-rotating";
  Job job(train_cmd(dir(), "rotating", "--steps 1000000 --set train.checkpoint_every=1 --set train.keep_checkpoints=1"));
  ASSERT_TRUE(job.until("step")) << job.out;
  // Until its first checkpoint is complete, "no complete checkpoint" is the right answer.
  for (int k = 0; k < 600 && !fs::exists(run_dir / "checkpoints" / "latest"); ++k)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(fs::exists(run_dir / "checkpoints" / "latest")) << job.out;
  for (int k = 0; k < 20; ++k) {
    const Launch e = run(kEnv + kBinary + " eval --init " + run_dir.string() + " --json");
    EXPECT_TRUE(e.status == 0 || (e.status == 2 && contains(e.out, "a run is writing there"))) << "try " << k << ": " << e.out;
    EXPECT_FALSE(contains(e.out, "cannot open")) << "try " << k << ": " << e.out;
  }
  kill(job.pid, SIGKILL);
}
