// K-FAC inline and skipped in the runtime equals the single-process Trainer's own K-FAC branch
// (pipefisher_fixture.hpp: trainer_weights), and K-FAC changes the weights at all.
#include "pipefisher_fixture.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

using namespace pf_test::pipefisher;

TEST(PipeFisherRuntime, InlineAndSkipEqualTrainer) {
  struct Case {
    std::string name;
    int ranks;
    std::string sets;
    std::vector<std::string> cfg;
  };
  const std::vector<Case> cases = {
      {"inline_1f1b", 2, "--set parallel.stages=2 --set parallel.schedule=1f1b --set kfac.placement=inline",
       {"kfac.placement=inline"}},
      {"skip_gpipe", 2,
       "--set parallel.stages=2 --set parallel.schedule=gpipe --set kfac.placement=skip --set kfac.inverse_every=3",
       {"kfac.placement=skip", "kfac.inverse_every=3"}},
      {"inline_chimera", 2, "--set parallel.stages=2 --set parallel.schedule=chimera --set kfac.placement=inline",
       {"kfac.placement=inline"}},
      {"skip_dp2", 4,
       "--set parallel.stages=2 --set parallel.schedule=1f1b --set parallel.data_parallel=2 --set parallel.micro_batches=2 "
       "--set kfac.placement=skip --set kfac.inverse_every=2",
       {"parallel.data_parallel=2", "parallel.micro_batches=2", "kfac.placement=skip", "kfac.inverse_every=2"}},
  };
  for (const Case& c : cases) {
    Launched r = launch(c.ranks, c.name, c.sets);
    ASSERT_EQ(r.status, 0) << r.out;
    expect_close(saved_weights(dir() / (c.name + ".safetensors")), trainer_weights(load_config(c.cfg)), c.name);
  }
}

// ZB-H1 and ZB-H2 run I and W apart (B's curvature taken at I, A's at F): with K-FAC inline and
// skipped they still end at the trainer's weights (bubbles: BubblesEqualSingleProcessWithSamePattern).
TEST(PipeFisherRuntime, ZeroBubbleInlineAndSkipEqualTrainer) {
  for (const std::string placement : {"inline", "skip"})
    for (const std::string h : {"h1", "h2"}) {
      const std::string name = "zb" + h + "_" + placement;
      Launched r = launch(2, name, "--set parallel.stages=2 --set parallel.schedule=zb-" + h +
                                       " --set kfac.placement=" + placement + " --set kfac.inverse_every=2");
      ASSERT_EQ(r.status, 0) << r.out;
      expect_close(saved_weights(dir() / (name + ".safetensors")),
                   trainer_weights(load_config({"kfac.placement=" + placement, "kfac.inverse_every=2"})), name);
    }
}

// K-FAC must matter: the same 1F1B run with K-FAC off ends elsewhere (by far more than 1e-5).
TEST(PipeFisherRuntime, KfacChangesTheWeights) {
  Launched r = launch(2, "plain_1f1b", "--set parallel.stages=2 --set parallel.schedule=1f1b --set kfac.enabled=false");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto plain = saved_weights(dir() / "plain_1f1b.safetensors");
  const auto kfac = trainer_weights(load_config({"kfac.placement=inline"}));
  double worst = 0;
  for (const auto& [name, w] : kfac)
    if (plain.count(name))
      for (size_t i = 0; i < w.size(); ++i) worst = std::max(worst, std::fabs(double(plain.at(name)[i]) - w[i]));
  EXPECT_GT(worst, 1e-3);
}
