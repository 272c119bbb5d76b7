// The single-process trainer with kfac.enabled = false: the K-FAC branch changes none of the plain
// path's results (no Linear carries a tap), the same seed and thread count give the same bits, and
// the values recorded before the K-FAC driver existed still come out, to float32 rounding.
#include "train/trainer.hpp"
#include "train_fixture.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

using namespace pf;

namespace {

// The sum of all weights, and the sum of their magnitudes (the scale of its rounding error).
std::pair<double, double> weight_sums(Model& m) {
  double s = 0, a = 0;
  for (Param* p : m.params())
    for (float v : p->value.span()) s += v, a += std::fabs(v);
  return {s, a};
}

struct FourSteps {
  std::vector<StepStats> steps;
  double weight_sum = 0, weight_magnitude = 0, valid = 0;
};

FourSteps four_steps() {
  Trainer t(test::sample_config());
  FourSteps r;
  for (int s = 0; s < 4; ++s) r.steps.push_back(t.step());
  std::tie(r.weight_sum, r.weight_magnitude) = weight_sums(t.model());
  r.valid = t.evaluate();
  for (Linear* l : t.model().linears()) EXPECT_EQ(l->tap(), nullptr) << l->name();
  return r;
}

}  // namespace

TEST(Trainer, PlainStepsRepeatTheirBits) {
  const FourSteps a = four_steps(), b = four_steps();
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(a.steps[s].loss, b.steps[s].loss) << "step " << s;
    EXPECT_EQ(a.steps[s].grad_norm, b.steps[s].grad_norm) << "step " << s;
  }
  EXPECT_EQ(a.weight_sum, b.weight_sum);
  EXPECT_EQ(a.valid, b.valid);
}

// Recorded on an AMD Zen 3 (OpenBLAS's Zen kernels) before the K-FAC driver existed. Another
// kernel family sums the products in another order: each float32 dot product of length K
// (K <= 512 here: hidden 128, MLP 512) may differ by K * eps relative, and four NVLAMB steps carry
// that into the weights. The tolerance, 512 * eps = 6.1e-5 relative, is that bound for one
// product; a K-FAC term leaking into the plain path (a change of order 1e-2) is far outside it.
TEST(Trainer, PlainStepsMatchTheirRecordedValues) {
  const double tol = 512 * std::numeric_limits<float>::epsilon();
  const double loss[] = {0x1.4b15bdp+3, 0x1.4bc48cp+3, 0x1.4afdeep+3, 0x1.4a27cp+3};
  const double norm[] = {0x1.7392d783bdf73p+1, 0x1.43d12af79b23fp+1, 0x1.5834d4f13b70ep+1, 0x1.3d5d344ae091dp+1};
  const FourSteps r = four_steps();
  for (int s = 0; s < 4; ++s) {
    EXPECT_NEAR(r.steps[s].loss, loss[s], tol * loss[s]) << "step " << s;
    EXPECT_NEAR(r.steps[s].grad_norm, norm[s], tol * norm[s]) << "step " << s;
  }
  // The sum of all weights cancels (weights of both signs): the bound is relative to the sum of
  // their magnitudes.
  EXPECT_NEAR(r.weight_sum, 0x1.b5ff580b2dbb2p+9, tol * r.weight_magnitude);
  EXPECT_NEAR(r.valid, 0x1.4b7fc6p+3, tol * r.valid);
}

// The standard error of a mean over micro-batches, by hand: means 2 and 6 of one position each
// (shares 1 and 3 of the mean 4) give sqrt(2 * (1 + 1)) = 2; weighted by positions 1 and 3, means
// 2 and 6 have shares 0.5 and 4.5 of the mean 5, deviations 0.5 - 1.25 and 4.5 - 3.75, so
// sqrt(2 * 2 * 0.75^2) = 1.5. A single micro-batch has none.
TEST(Evaluate, BatchMeanStandardErrorByHand) {
  const std::vector<double> equal = {1, 3}, weighted = {0.5, 4.5};
  const std::vector<int64_t> ones = {1, 1}, one_three = {1, 3};
  EXPECT_DOUBLE_EQ(batch_mean_standard_error(equal, ones), 2.0);
  EXPECT_DOUBLE_EQ(batch_mean_standard_error(weighted, one_three), 1.5);
  const std::vector<double> single = {4};
  const std::vector<int64_t> n = {7};
  EXPECT_TRUE(std::isnan(batch_mean_standard_error(single, n)));
}
