// K-FAC in the single-process trainer, on bert-tiny and the committed sample text: the refresh
// pattern (inverses change exactly at refresh steps), K-FAC's warm-up, and seeded short runs where
// K-FAC lowers the loss faster per step than NVLAMB at the same settings.
#include "core/error.hpp"
#include "train/trainer.hpp"
#include "train_fixture.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

using namespace pf;

namespace {

Config kfac_config(const std::string& placement, int every, int rows = 4) {
  Config c = test::sample_config(32, 2, rows);
  c.kfac.enabled = true;
  c.kfac.placement = parse_name<Placement>(placement).value();
  c.kfac.inverse_every = every;
  return c;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), a.numel() * sizeof(float)) == 0;
}

struct Curve {
  std::vector<double> loss;  // per step
  double valid = 0;          // after the last step
};

Curve run(const Config& c, int steps) {
  Trainer t(c);
  Curve r;
  for (int s = 0; s < steps; ++s) r.loss.push_back(t.step().loss);
  r.valid = t.evaluate();
  return r;
}

double mean(const std::vector<double>& v, size_t from) {
  double s = 0;
  for (size_t i = from; i < v.size(); ++i) s += v[i];
  return s / static_cast<double>(v.size() - from);
}

}  // namespace

// inline k: factors every step, inverses at s % k == 0; skip k: both only at s % k == 0. Between
// refreshes every inverse keeps its bits; at a refresh every dense one changes.
TEST(KfacTrainer, InversesChangeExactlyAtRefreshSteps) {
  struct Pattern {
    const char* placement;
    int every;
  };
  for (Pattern p : {Pattern{"inline", 1}, Pattern{"inline", 2}, Pattern{"skip", 3}}) {
    SCOPED_TRACE(std::string(p.placement) + " every " + std::to_string(p.every));
    Trainer t(kfac_config(p.placement, p.every));
    KfacPreconditioner& k = *t.kfac();
    int64_t curvature_steps = 0, inversion_steps = 0;
    for (int s = 0; s < 7; ++s) {
      std::vector<Tensor> before;
      for (size_t i = 0; i < k.size(); ++i) {
        before.push_back(k.layer(i).a().inverse());
        before.push_back(k.layer(i).b().inverse());
      }
      StepStats st = t.step();
      const bool curv = std::string(p.placement) == "inline" || s % p.every == 0;
      const bool inv = s % p.every == 0;
      EXPECT_EQ(st.kfac_curvature, curv) << "step " << s;
      EXPECT_EQ(st.kfac_inversion, inv) << "step " << s;
      curvature_steps += curv;
      inversion_steps += inv;
      for (size_t i = 0; i < k.size(); ++i) {
        EXPECT_EQ(k.layer(i).a().commits(), curvature_steps) << k.layer(i).name();
        EXPECT_EQ(k.layer(i).b().commits(), curvature_steps) << k.layer(i).name();
        EXPECT_EQ(!same_bits(before[2 * i], k.layer(i).a().inverse()), inv) << "step " << s << " " << k.layer(i).name();
        EXPECT_EQ(!same_bits(before[2 * i + 1], k.layer(i).b().inverse()), inv) << "step " << s << " " << k.layer(i).name();
        EXPECT_EQ(k.layer(i).a().inversions(), inversion_steps);
      }
      for (Linear* l : t.model().linears()) EXPECT_EQ(l->tap(), nullptr) << "taps left after step " << s;
    }
  }
}

TEST(KfacTrainer, OwnWarmupAndPlacement) {
  Config c = test::sample_config();
  c.optim.warmup_steps = 10;
  c.kfac.warmup_steps = 4;
  EXPECT_EQ(make_run_lr_schedule(c).warmup_steps, 10);  // K-FAC off: optim's
  c.kfac.enabled = true;
  EXPECT_EQ(make_run_lr_schedule(c).warmup_steps, 4);
  EXPECT_DOUBLE_EQ(make_run_lr_schedule(c).at(0), c.optim.lr / 4);
  c.kfac.warmup_steps = -1;
  EXPECT_EQ(make_run_lr_schedule(c).warmup_steps, 10);
  c.kfac.placement = pf::Placement::Bubbles;  // needs a pipeline
  EXPECT_THROW(Trainer{c}, UsageError);
}

// bert-tiny, seq 32, 2 x 8 sequences per step, 20 steps, NVLAMB with 5 warm-up steps then
// polynomial decay: NVLAMB alone vs K-FAC (inline, damping 1e-3, no EMA, no KL-clip) then NVLAMB,
// the same schedule for both. At lr 1e-2 and 4e-2 K-FAC is ahead at every measure, by a margin.
// (At 8e-2, where NVLAMB's own 20-step loss is lowest, the two end level: see bench/RESULTS.md.)
TEST(KfacTrainer, LowersTheLossFasterPerStepThanNvlamb) {
  for (double lr : {1e-2, 4e-2}) {
    Config c = test::sample_config(32, 2, 8);
    c.optim.lr = lr;
    c.train.steps = 20;
    c.train.eval_batches = 8;
    const Curve base = run(c, c.train.steps);
    c.kfac.enabled = true;
    c.kfac.placement = pf::Placement::Inline;
    const Curve kfac = run(c, c.train.steps);
    std::printf("lr %g  step: nvlamb kfac\n", lr);
    for (size_t s = 0; s < base.loss.size(); ++s) std::printf("  %2zu: %.4f %.4f\n", s, base.loss[s], kfac.loss[s]);
    std::printf("  valid: %.4f %.4f\n", base.valid, kfac.valid);
    EXPECT_LT(kfac.valid, base.valid - 0.5) << "lr " << lr;
    EXPECT_LT(mean(kfac.loss, 5), mean(base.loss, 5) - 0.4) << "lr " << lr;
  }
}

// The two norms of a step: grad_norm is the loss gradient's whatever the optimizer, so the first
// step (same weights, same batch) gives NVLAMB's bits; precond_grad_norm is the norm after K-FAC's
// precondition, what clipping sees, and absent (NaN) without K-FAC.
TEST(KfacTrainer, GradNormIsTheLossGradientsAndThePreconditionedOneIsLoggedBeside) {
  Config with = kfac_config("inline", 1), without = with;
  without.kfac.enabled = false;
  Trainer k(with), plain(without);
  const StepStats a = k.step(), b = plain.step();
  EXPECT_EQ(a.grad_norm, b.grad_norm);
  EXPECT_TRUE(std::isnan(b.precond_grad_norm));
  ASSERT_TRUE(std::isfinite(a.precond_grad_norm));
  EXPECT_GT(std::fabs(a.precond_grad_norm / a.grad_norm - 1), 1e-2);  // K-FAC rescales it
}
