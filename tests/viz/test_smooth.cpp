// The paper's loss smoothing (viz/smooth.hpp), checked by properties that do not need scipy: the
// bilinear Butterworth's exact squared magnitude, unit DC gain, zero phase of filtfilt.
#include "viz/loss_chart.hpp"
#include "viz/smooth.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <numbers>
#include <regex>
#include <string>
#include <vector>

namespace pf {
namespace {

constexpr double kPi = std::numbers::pi;

// |H(e^{jw})|^2 of the bilinear-transformed Butterworth: 1 / (1 + (tan(w/2) / tan(wc/2))^(2N)),
// w in radians per sample, wc = pi x cutoff.
double designed_power(double w, int order, double cutoff) {
  return 1.0 / (1.0 + std::pow(std::tan(w / 2) / std::tan(kPi * cutoff / 2), 2 * order));
}

// |H(e^{jw})|^2 evaluated from the coefficients.
double power_of(const IirFilter& f, double w) {
  std::complex<double> num = 0, den = 0;
  for (size_t k = 0; k < f.b.size(); ++k) num += f.b[k] * std::polar(1.0, -w * static_cast<double>(k));
  for (size_t k = 0; k < f.a.size(); ++k) den += f.a[k] * std::polar(1.0, -w * static_cast<double>(k));
  return std::norm(num / den);
}

std::vector<double> sinusoid(int n, double cycles_per_sample, double amplitude, double offset = 0) {
  std::vector<double> x(n);
  for (int t = 0; t < n; ++t) x[t] = offset + amplitude * std::sin(2 * kPi * cycles_per_sample * t + 0.3);
  return x;
}

TEST(Butterworth, CoefficientsHaveTheDesignedMagnitude) {
  const IirFilter f = paper_loss_filter();
  ASSERT_EQ(f.b.size(), 4u);
  ASSERT_EQ(f.a.size(), 4u);
  EXPECT_EQ(f.a[0], 1.0);
  // The zeros at z = -1: b is proportional to 1, 3, 3, 1.
  EXPECT_NEAR(f.b[1] / f.b[0], 3.0, 1e-12);
  EXPECT_NEAR(f.b[2] / f.b[0], 3.0, 1e-12);
  EXPECT_NEAR(f.b[3] / f.b[0], 1.0, 1e-12);
  for (double w : {0.0, 0.01, 0.05 * kPi, 0.1, 0.3, 1.0, 2.5})
    EXPECT_NEAR(power_of(f, w), designed_power(w, 3, 0.05), 1e-12) << w;
  EXPECT_NEAR(power_of(f, 0.05 * kPi), 0.5, 1e-12);  // -3 dB at the cutoff
  // Other orders and cutoffs follow the same formula.
  for (int order : {1, 2, 5})
    for (double c : {0.1, 0.4})
      EXPECT_NEAR(power_of(butterworth_lowpass(order, c), 0.2), designed_power(0.2, order, c), 1e-10);
}

TEST(Filtfilt, ConstantPassesUnchanged) {
  const std::vector<double> x(300, 7.25);
  const std::vector<double> y = filtfilt(paper_loss_filter(), x);
  ASSERT_EQ(y.size(), x.size());
  for (double v : y) EXPECT_NEAR(v, 7.25, 1e-9);
  // A short series too (the padding shrinks to fit).
  for (double v : filtfilt(paper_loss_filter(), std::vector<double>(5, -1.5))) EXPECT_NEAR(v, -1.5, 1e-9);
}

// Away from the ends (the initial transient), filtfilt of a sinusoid is the same sinusoid times
// |H|^2: attenuated by the designed power gain and not shifted (zero phase), so y = g x sample by
// sample. Frequencies in cycles per sample; the cutoff is 0.025 (0.05 of Nyquist).
TEST(Filtfilt, SinusoidsAreScaledByTheDesignedGainWithoutPhaseShift) {
  const IirFilter f = paper_loss_filter();
  for (double freq : {0.005, 0.025, 0.04, 0.1, 0.3}) {
    const int n = 4000;
    const std::vector<double> x = sinusoid(n, freq, 1.0, 3.0);
    const std::vector<double> y = filtfilt(f, x);
    const double g = designed_power(2 * kPi * freq, 3, 0.05);
    double worst = 0;
    for (int t = 1000; t < n - 1000; ++t) worst = std::max(worst, std::fabs((y[t] - 3.0) - g * (x[t] - 3.0)));
    EXPECT_LT(worst, 1e-6) << "frequency " << freq << ", gain " << g;
  }
  EXPECT_LT(designed_power(2 * kPi * 0.1, 3, 0.05), 1e-3);  // "far above cutoff" is strongly attenuated
}

// A step (a loss that drops at step 500): forward-only filtering delays it, filtfilt keeps it
// centred (the smoothed curve crosses the midpoint where the raw one drops).
TEST(Filtfilt, ZeroPhaseKeepsAStepInPlace) {
  std::vector<double> x(1000);
  for (int t = 0; t < 1000; ++t) x[t] = t < 500 ? 8.0 : 6.0;
  const std::vector<double> y = filtfilt(paper_loss_filter(), x);
  EXPECT_NEAR(y[499] + y[500], 14.0, 0.05);  // symmetric about the drop
  EXPECT_GT(y[480], 7.5);
  EXPECT_LT(y[520], 6.5);
  // The one-way filter (from the old level's steady state) crosses the midpoint several samples late.
  std::vector<double> warm(x.size() + 2000, 8.0);
  std::copy(x.begin(), x.end(), warm.begin() + 2000);
  const std::vector<double> fwd = lfilter(paper_loss_filter(), warm, {});
  int late = 0;
  while (late < 1000 && fwd[2000 + late] > 7.0) ++late;
  EXPECT_GT(late, 505);
  EXPECT_LT(late, 1000);
}

// From kPaperFilterMinSteps samples on a loss curve is smoothed by the paper's filter as scipy
// would (the same numbers to the bit); below, by a cutoff raised in proportion to the shortness.
TEST(LossSmoothing, LongRunsUseThePapersFilterUnchanged) {
  for (size_t n : {kPaperFilterMinSteps, size_t{400}}) {
    std::vector<double> x(n);
    for (size_t t = 0; t < n; ++t) x[t] = 6 + 5 * std::exp(-static_cast<double>(t) / 30) + 0.05 * std::sin(1.7 * t);
    EXPECT_EQ(smooth_loss(x), filtfilt(paper_loss_filter(), x)) << n;
  }
  EXPECT_EQ(loss_filter_cutoff(kPaperFilterMinSteps), 0.05);
  EXPECT_EQ(loss_filter_cutoff(1000), 0.05);
  EXPECT_DOUBLE_EQ(loss_filter_cutoff(40), 0.1);
  EXPECT_DOUBLE_EQ(loss_filter_cutoff(20), 0.2);
  EXPECT_DOUBLE_EQ(loss_filter_cutoff(4), 1.0);
}

// A short run's loss falling fast, with step-to-step noise: its smoothed curve follows the
// noise-free curve within 5% of the run's drop at every step, ends included (the paper's filter
// alone left a 5-step run's line flat above every raw point, ending half the drop too high).
TEST(LossSmoothing, ShortRunsEndNearTheirCurve) {
  for (size_t n : {size_t{5}, size_t{8}, size_t{20}, size_t{50}, kPaperFilterMinSteps - 1}) {
    std::vector<double> clean(n), x(n);
    for (size_t t = 0; t < n; ++t) {
      clean[t] = 6 + 5 * std::exp(-3.0 * static_cast<double>(t) / static_cast<double>(n));
      x[t] = clean[t] + (t % 2 ? 0.02 : -0.02);
    }
    const std::vector<double> y = smooth_loss(x);
    ASSERT_EQ(y.size(), n);
    const double drop = clean.front() - clean.back();
    for (size_t t = 0; t < n; ++t)
      EXPECT_LT(std::fabs(y[t] - clean[t]), 0.05 * drop) << n << " steps, step " << t << ": " << y[t] << " vs " << clean[t];
  }
  // Four steps or fewer: nothing to smooth over.
  const std::vector<double> four = {10, 9.5, 9.7, 9};
  EXPECT_EQ(smooth_loss(four), four);
}

// A falling curve of n steps named `name`.
LossCurve falling(const std::string& name, size_t n) {
  LossCurve c;
  c.name = name;
  for (size_t t = 0; t < n; ++t) {
    c.step.push_back(static_cast<double>(t + 1));
    c.time_s.push_back(0.5 * static_cast<double>(t + 1));
    c.loss.push_back(6 + 5 * std::exp(-static_cast<double>(t) / 10) + (t % 2 ? 0.03 : -0.03));
  }
  return c;
}

// report's picture names the cutoff its curves were smoothed with, and keeps their lowest point
// inside the panel (not on its clipped edge, where half the line's width is cut away).
TEST(LossChart, SubtitleNamesTheCutoffUsedAndTheLowestPointIsNotClipped) {
  std::vector<LossCurve> one = {falling("long", 400)};
  smooth_curves(one);
  std::string svg = loss_chart_svg(one, {});
  EXPECT_NE(svg.find("smoothed (Butterworth, 3rd order, cutoff 0.05, forward-backward)"), std::string::npos);
  std::vector<LossCurve> two = {falling("long", 400), falling("short", 20)};
  smooth_curves(two);
  svg = loss_chart_svg(two, {});
  EXPECT_NE(svg.find("forward-backward; cutoff long 0.05, short 0.2)"), std::string::npos) << svg.substr(0, 600);

  std::smatch m;
  ASSERT_TRUE(std::regex_search(svg, m, std::regex(R"re(<clipPath id="plot0"><rect x="\d+" y="(\d+)" width="\d+" height="(\d+)")re")));
  const double bottom = std::stod(m[1]) + std::stod(m[2]);
  double lowest = 0;  // the largest y of any line's point (SVG's y grows downwards)
  const std::regex point(R"([ML](-?[0-9.]+),(-?[0-9.]+))");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), point); it != std::sregex_iterator(); ++it)
    lowest = std::max(lowest, std::stod((*it)[2]));
  EXPECT_LT(lowest, bottom - 2.2) << "a 2.2-wide line at y " << lowest << " against the panel's edge at " << bottom;
}

}  // namespace
}  // namespace pf
