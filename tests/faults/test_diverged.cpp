// Issue 34, item 6: a diverged run is not reported as a success. train.on_nonfinite = skip skips at
// most 5 non-finite steps in a row, then stops with a nonzero status naming the last finite step
// and the last checkpoint, without writing the run's model; a run whose last step was not finite
// writes no model either; `eval` of weights whose loss is not finite exits nonzero.
#include "../checkpoint/cli.hpp"
#include "../support/weights.hpp"

#include "io/safetensors.hpp"

namespace {

using namespace pf_test;

fs::path dir() { return work_dir("diverged"); }

}  // namespace

TEST(Diverged, SkippingEveryStepStopsTheRunNonzero) {
  tiny_config(dir());
  // optim.lr = 1e30: the first update overflows the weights, every later step is not finite.
  Launch r = run(train_cmd(dir(), "lr", "--set optim.lr=1e30 --set train.steps=20 --set train.checkpoint_every=0"));
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "6 steps in a row were not finite: the run diverged")) << r.out;
  EXPECT_TRUE(contains(r.out, "the last finite step was 1")) << r.out;
  EXPECT_FALSE(fs::exists(dir() / "out-lr" / "model.safetensors")) << r.out;
  // Up to 5 skipped steps in a row are a few bad batches: the run goes on, but a run whose last
  // step was not finite does not write its weights as its result either.
  Launch few = run(train_cmd(dir(), "few", "--set optim.lr=1e30 --set train.steps=6 --set train.checkpoint_every=0"));
  EXPECT_EQ(few.status, 1) << few.out;
  EXPECT_FALSE(contains(few.out, "the run diverged")) << few.out;
  EXPECT_TRUE(contains(few.out, "the last 5 steps were not finite")) << few.out;
  EXPECT_FALSE(fs::exists(dir() / "out-few" / "model.safetensors")) << few.out;
}

TEST(Diverged, EvalOfWeightsWithoutAFiniteLossExitsNonzero) {
  tiny_config(dir());
  Launch r = run(train_cmd(dir(), "ok", "--set train.steps=1 --save " + (dir() / "ok.safetensors").string()));
  ASSERT_EQ(r.status, 0) << r.out;
  // The same tensors, every value 1e30: finite, but the forward overflows.
  auto w = read_weights(dir() / "ok.safetensors");
  pf::SafetensorsReader reader((dir() / "ok.safetensors").string());
  std::vector<pf::SafetensorsTensor> tensors;
  for (const auto& e : reader.tensors()) {
    std::vector<float>& v = w.at(e.name);
    for (float& x : v) x = 1e30f;
    tensors.push_back({e.name, e.shape, v});
  }
  pf::write_safetensors((dir() / "huge.safetensors").string(), tensors);
  Launch e = run(kEnv + kBinary + " eval --config " + (dir() / "tiny.toml").string() + " --init " +
                 (dir() / "huge.safetensors").string() + " --json");
  EXPECT_EQ(e.status, 1) << e.out;
  EXPECT_TRUE(contains(e.out, "is not finite")) << e.out;
  Launch fine = run(kEnv + kBinary + " eval --config " + (dir() / "tiny.toml").string() + " --init " +
                    (dir() / "ok.safetensors").string() + " --json");
  EXPECT_EQ(fine.status, 0) << fine.out;
}

// Issue 50, item 2: optim.lr = 1e30 over one step: the step's loss is finite, its update overflows
// the weights, the final validation loss is not finite. The run diverged: status 1, no model, no
// summary; with an evaluation mid-run it stops there, before that state's checkpoint. The same
// under mpirun.
TEST(Diverged, ALastUpdateThatDivergesWritesNoModel) {
  tiny_config(dir());
  const std::string lr = "--set optim.lr=1e30 --set optim.warmup_steps=0 ";
  Launch r = run(train_cmd(dir(), "last", lr + "--steps 1"));
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "after step 1: the run diverged")) << r.out;
  for (const char* f : {"model.safetensors", "summary.json", "checkpoints/step-000001"})
    EXPECT_FALSE(fs::exists(dir() / "out-last" / f)) << f << "\n" << r.out;
  Launch mid = run(train_cmd(dir(), "mid", lr + "--steps 4 --set train.eval_every=1 --set train.checkpoint_every=1"));
  EXPECT_EQ(mid.status, 1) << mid.out;
  EXPECT_TRUE(contains(mid.out, "after step 1: the run diverged")) << mid.out;
  EXPECT_FALSE(fs::exists(dir() / "out-mid" / "checkpoints" / "step-000001")) << mid.out;
  EXPECT_FALSE(fs::exists(dir() / "out-mid" / "model.safetensors")) << mid.out;
  Launch mpi = run(mpi_train_cmd(2, dir(), "mpilast", lr + "--steps 1 --set parallel.stages=2"));
  EXPECT_EQ(mpi.status, 1) << mpi.out;
  EXPECT_TRUE(contains(mpi.out, "after step 1: the run diverged")) << mpi.out;
  EXPECT_FALSE(fs::exists(dir() / "out-mpilast" / "model.safetensors")) << mpi.out;
}
