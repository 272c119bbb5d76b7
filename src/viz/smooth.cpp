#include "viz/smooth.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <cmath>
#include <complex>
#include <numbers>

namespace pf {
namespace {

using cd = std::complex<double>;

// Coefficients of prod_k (z - roots[k]), highest power first (real parts: roots come in
// conjugate pairs).
std::vector<double> poly(const std::vector<cd>& roots) {
  std::vector<cd> c{1.0};
  for (const cd& r : roots) {
    c.push_back(0.0);
    for (size_t i = c.size() - 1; i > 0; --i) c[i] -= r * c[i - 1];
  }
  std::vector<double> out;
  for (const cd& x : c) out.push_back(x.real());
  return out;
}

// scipy.signal.lfilter_zi: the state that makes a unit step input a steady state, from
// (I - companion(a)^T) zi = b[1:] - a[1:] b[0], solved by Gaussian elimination (n is tiny).
std::vector<double> steady_state(const IirFilter& f) {
  const size_t n = f.a.size() - 1;
  std::vector<std::vector<double>> m(n, std::vector<double>(n + 1, 0.0));
  for (size_t i = 0; i < n; ++i) {
    // companion(a): first row -a[1:], ones on the subdiagonal; its transpose: first column -a[1:].
    m[i][i] += 1.0;
    m[i][0] += f.a[i + 1];
    if (i + 1 < n) m[i][i + 1] -= 1.0;
    m[i][n] = f.b[i + 1] - f.a[i + 1] * f.b[0];
  }
  for (size_t c = 0; c < n; ++c) {
    size_t p = c;
    for (size_t r = c + 1; r < n; ++r)
      if (std::fabs(m[r][c]) > std::fabs(m[p][c])) p = r;
    std::swap(m[c], m[p]);
    PF_CHECK(m[c][c] != 0, "singular steady-state system for the filter");
    for (size_t r = 0; r < n; ++r) {
      if (r == c) continue;
      const double k = m[r][c] / m[c][c];
      for (size_t j = c; j <= n; ++j) m[r][j] -= k * m[c][j];
    }
  }
  std::vector<double> zi(n);
  for (size_t i = 0; i < n; ++i) zi[i] = m[i][n] / m[i][i];
  return zi;
}

}  // namespace

IirFilter butterworth_lowpass(int order, double cutoff) {
  PF_CHECK(order >= 1 && cutoff > 0 && cutoff < 1, "butterworth_lowpass(order {}, cutoff {})", order, cutoff);
  const double pi = std::numbers::pi, fs2 = 4.0;  // scipy's fs = 2 (Nyquist 1): bilinear uses 2 fs
  const double warped = fs2 * std::tan(pi * cutoff / 2);  // pre-warped analog cutoff
  std::vector<cd> poles;
  cd gain_den = 1.0;
  for (int k = 0; k < order; ++k) {
    const cd p = warped * std::polar(1.0, pi * (2.0 * k + order + 1) / (2.0 * order));  // left half-plane
    gain_den *= fs2 - p;
    poles.push_back((fs2 + p) / (fs2 - p));  // bilinear transform
  }
  IirFilter f;
  f.a = poly(poles);
  const double k = std::pow(warped, order) / gain_den.real();
  f.b = poly(std::vector<cd>(order, cd(-1.0)));  // the zeros at infinity land on z = -1
  for (double& x : f.b) x *= k;
  return f;
}

IirFilter paper_loss_filter() { return butterworth_lowpass(3, 0.05); }

std::vector<double> lfilter(const IirFilter& f, std::span<const double> x, std::span<const double> zi) {
  const size_t n = f.a.size() - 1;
  PF_CHECK(f.b.size() == f.a.size() && f.a[0] == 1.0, "filter coefficients b {} a {}", f.b.size(), f.a.size());
  std::vector<double> z(n + 1, 0.0), y(x.size());
  if (!zi.empty()) std::copy(zi.begin(), zi.end(), z.begin());
  for (size_t t = 0; t < x.size(); ++t) {
    y[t] = f.b[0] * x[t] + z[0];
    for (size_t i = 0; i < n; ++i) z[i] = f.b[i + 1] * x[t] - f.a[i + 1] * y[t] + z[i + 1];
  }
  return y;
}

std::vector<double> filtfilt(const IirFilter& f, std::span<const double> x, size_t pad_wanted) {
  const size_t len = x.size();
  if (len < 2) return {x.begin(), x.end()};
  const size_t pad = std::min(pad_wanted > 0 ? pad_wanted : 3 * std::max(f.a.size(), f.b.size()), len - 1);
  // Odd extension: 2 x[0] - x[pad..1], x, 2 x[-1] - x[-2..-pad-1].
  std::vector<double> ext;
  ext.reserve(len + 2 * pad);
  for (size_t i = pad; i >= 1; --i) ext.push_back(2 * x[0] - x[i]);
  ext.insert(ext.end(), x.begin(), x.end());
  for (size_t i = 1; i <= pad; ++i) ext.push_back(2 * x[len - 1] - x[len - 1 - i]);
  const std::vector<double> zi = steady_state(f);
  auto scaled = [&](double v) {
    std::vector<double> s = zi;
    for (double& e : s) e *= v;
    return s;
  };
  std::vector<double> y = lfilter(f, ext, scaled(ext.front()));
  std::reverse(y.begin(), y.end());
  y = lfilter(f, y, scaled(y.front()));
  std::reverse(y.begin(), y.end());
  return {y.begin() + static_cast<std::ptrdiff_t>(pad), y.begin() + static_cast<std::ptrdiff_t>(pad + len)};
}

double loss_filter_cutoff(size_t steps) {
  constexpr double paper = 0.05;
  return steps >= kPaperFilterMinSteps ? paper : paper * static_cast<double>(kPaperFilterMinSteps) / static_cast<double>(std::max<size_t>(steps, 1));
}

std::vector<double> smooth_loss(std::span<const double> x) {
  if (x.size() >= kPaperFilterMinSteps) return filtfilt(paper_loss_filter(), x);
  const double cutoff = loss_filter_cutoff(x.size());
  if (cutoff >= 1) return {x.begin(), x.end()};
  return filtfilt(butterworth_lowpass(3, cutoff), x, x.size() - 1);
}

}  // namespace pf
