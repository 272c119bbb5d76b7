// Kernels against naive double-precision references, and bit-determinism across thread counts.
#include "core/blas.hpp"
#include "core/kernels.hpp"
#include "core/rng.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

using namespace pf;

namespace {
std::vector<float> randn(int64_t n, uint64_t seed, float scale = 1.0f) {
  CounterRng r{stream_key(seed, "test")};
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = scale * r.normal(i);
  return v;
}
}  // namespace

TEST(Kernels, FastExpErfTanhMatchLibm) {
  double max_rel = 0, max_erf = 0, max_tanh = 0;
  for (double x = -80; x <= 80; x += 0.01) {
    double e = std::exp(double(float(x)));
    max_rel = std::max(max_rel, std::abs(fast_exp(float(x)) - e) / e);
  }
  for (double x = -6; x <= 6; x += 0.001) {
    max_erf = std::max(max_erf, std::abs(double(fast_erf(float(x))) - std::erf(double(float(x)))));
    max_tanh = std::max(max_tanh, std::abs(double(fast_tanh(float(x))) - std::tanh(double(float(x)))));
  }
  EXPECT_LT(max_rel, 3e-7);
  EXPECT_LT(max_erf, 3e-7);
  EXPECT_LT(max_tanh, 3e-7);
}

TEST(Kernels, GemmAllTransposesMatchNaive) {
  const int m = 5, n = 7, k = 3;
  auto a = randn(m * k, 1), b = randn(k * n, 2);
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      // a holds op(A) (m x k) stored transposed when ta; likewise b.
      std::vector<float> c(m * n, 1.0f);
      gemm(ta, tb, m, n, k, 2.0f, a.data(), ta ? m : k, b.data(), tb ? k : n, 0.5f, c.data(), n);
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
          double s = 0;
          for (int p = 0; p < k; ++p) s += double(ta ? a[p * m + i] : a[i * k + p]) * (tb ? b[j * k + p] : b[p * n + j]);
          EXPECT_NEAR(c[i * n + j], 2 * s + 0.5, 1e-5) << ta << tb;
        }
    }
}

// Rows of 300 with the visible part cut at `visible` and every third key masked out.
TEST(Kernels, SoftmaxRowMatchesNaiveOverTheVisibleKeys) {
  const int rows = 7, cols = 300;
  auto x = randn(rows * cols, 3, 5.0f);
  std::vector<uint8_t> key_mask(cols);
  for (int j = 0; j < cols; ++j) key_mask[j] = j % 3 != 1;
  for (bool masked : {false, true}) {
    for (int r = 0; r < rows; ++r) {
      const int visible = cols - 37 * r;
      std::vector<float> y(x.begin() + r * cols, x.begin() + (r + 1) * cols);
      const SoftmaxRow z = softmax_row(y.data(), cols, visible, masked ? key_mask.data() : nullptr);
      auto seen = [&](int j) { return j < visible && (!masked || key_mask[j]); };
      double m = -1e30, s = 0;
      for (int j = 0; j < cols; ++j) if (seen(j)) m = std::max(m, double(x[r * cols + j]));
      for (int j = 0; j < cols; ++j) if (seen(j)) s += std::exp(x[r * cols + j] - m);
      EXPECT_EQ(z.max, float(m));
      EXPECT_NEAR(z.sum, s, 3e-6 * s * visible);  // float sum of visible terms each within 3e-6
      for (int j = 0; j < cols; ++j) {
        const double ref = seen(j) ? std::exp(x[r * cols + j] - m) / s : 0.0;
        if (seen(j)) EXPECT_NEAR(y[j], ref, 3e-6 * ref + 1e-12) << r << " " << j;  // float rounding of x - max
        else EXPECT_EQ(y[j], 0.0f) << r << " " << j;
      }
    }
  }
}

TEST(Kernels, SoftmaxRowWithNothingVisibleIsAllZero) {
  std::vector<float> y = {1, 2, 3, 4};
  const std::vector<uint8_t> none(4, 0);
  const SoftmaxRow z = softmax_row(y.data(), 4, 4, none.data());
  EXPECT_EQ(z.sum, 0.0f);
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

// Double-precision LayerNorm for one row.
static void ln_ref(const float* x, const float* w, const float* b, int C, double eps, double* y) {
  double m = 0, v = 0;
  for (int c = 0; c < C; ++c) m += x[c];
  m /= C;
  for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
  v /= C;
  for (int c = 0; c < C; ++c) y[c] = (x[c] - m) / std::sqrt(v + eps) * w[c] + b[c];
}

TEST(Kernels, LayerNormForwardAndBackwardMatchDoubleReference) {
  const int rows = 6, C = 40;
  const float eps = 1e-5f;
  auto x = randn(rows * C, 4, 2.0f), w = randn(C, 5), b = randn(C, 6), dy = randn(rows * C, 7);
  std::vector<float> y(rows * C), mean(rows), rstd(rows);
  layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, C, eps);
  std::vector<double> yr(C);
  for (int r = 0; r < rows; ++r) {
    ln_ref(&x[r * C], w.data(), b.data(), C, eps, yr.data());
    for (int c = 0; c < C; ++c) EXPECT_NEAR(y[r * C + c], yr[c], 2e-6 * (1 + std::abs(yr[c])));
  }
  // Backward: analytic in float vs the exact derivative of the double reference, by central
  // differences in double (the reference is smooth, so h = 1e-6 is accurate to ~1e-9).
  std::vector<float> dx(rows * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), rows,
                     C, false);
  auto loss = [&](const std::vector<float>& xx, const std::vector<float>& ww, const std::vector<float>& bb, int row) {
    std::vector<double> out(C);
    ln_ref(&xx[row * C], ww.data(), bb.data(), C, eps, out.data());
    double s = 0;
    for (int c = 0; c < C; ++c) s += out[c] * dy[row * C + c];
    return s;
  };
  // The reference takes float inputs: perturb in double by evaluating with a double copy.
  auto ln_ref_d = [&](const std::vector<double>& xx, int row) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += xx[c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (xx[c] - m) * (xx[c] - m);
    v /= C;
    double s = 0;
    for (int c = 0; c < C; ++c) s += ((xx[c] - m) / std::sqrt(v + eps) * w[c] + b[c]) * dy[row * C + c];
    return s;
  };
  for (int r = 0; r < rows; ++r) {
    std::vector<double> xd(x.begin() + r * C, x.begin() + (r + 1) * C);
    for (int c = 0; c < C; ++c) {
      const double h = 1e-6;
      xd[c] += h;
      double fp = ln_ref_d(xd, r);
      xd[c] -= 2 * h;
      double fm = ln_ref_d(xd, r);
      xd[c] += h;
      EXPECT_NEAR(dx[r * C + c], (fp - fm) / (2 * h), 2e-5) << r << "," << c;
    }
  }
  (void)loss;
  // dweight = sum_r dy * xhat, dbias = sum_r dy (closed forms in double)
  for (int c = 0; c < C; ++c) {
    double sw = 0, sb = 0;
    for (int r = 0; r < rows; ++r) {
      sw += double(dy[r * C + c]) * (x[r * C + c] - mean[r]) * rstd[r];
      sb += dy[r * C + c];
    }
    EXPECT_NEAR(dw[c], sw, 1e-5);
    EXPECT_NEAR(db[c], sb, 1e-5);
  }
}

TEST(Kernels, GeluBothFormsAndDerivatives) {
  const int n = 2001;
  std::vector<float> x(n), y(n), dx(n), ones(n, 1.0f);
  for (int i = 0; i < n; ++i) x[i] = -8.0f + 16.0f * i / (n - 1);
  for (Gelu kind : {Gelu::Erf, Gelu::Tanh}) {
    auto ref = [&](double v) {
      return kind == Gelu::Erf ? 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)))
                               : 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    };
    gelu_forward(y.data(), x.data(), n, kind);
    gelu_backward(dx.data(), x.data(), ones.data(), n, kind);
    for (int i = 0; i < n; ++i) {
      EXPECT_NEAR(y[i], ref(x[i]), 1e-6 * (1 + std::abs(x[i])));
      double h = 1e-5, d = (ref(x[i] + h) - ref(x[i] - h)) / (2 * h);
      EXPECT_NEAR(dx[i], d, 2e-6) << int(kind) << " x=" << x[i];
    }
  }
  // The two forms differ (by up to ~1e-3 near |x| ~ 2): a swapped form would be caught above.
  std::vector<float> ye(n), yt(n);
  gelu_forward(ye.data(), x.data(), n, Gelu::Erf);
  gelu_forward(yt.data(), x.data(), n, Gelu::Tanh);
  double maxdiff = 0;
  for (int i = 0; i < n; ++i) maxdiff = std::max(maxdiff, double(std::abs(ye[i] - yt[i])));
  EXPECT_GT(maxdiff, 1e-4);
}

TEST(Kernels, SoftmaxCrossEntropyMatchesReference) {
  const int rows = 5, V = 97;
  auto x = randn(rows * V, 8, 3.0f);
  std::vector<int32_t> lab = {0, 96, 13, 13, 50};
  auto p = x;
  std::vector<float> loss(rows);
  softmax_cross_entropy_forward(p.data(), loss.data(), lab.data(), rows, V);
  for (int r = 0; r < rows; ++r) {
    double m = -1e30, s = 0;
    for (int j = 0; j < V; ++j) m = std::max(m, double(x[r * V + j]));
    for (int j = 0; j < V; ++j) s += std::exp(x[r * V + j] - m);
    EXPECT_NEAR(loss[r], std::log(s) - (x[r * V + lab[r]] - m), 1e-5);
  }
  auto g = p;
  softmax_cross_entropy_backward(g.data(), lab.data(), rows, V, 0.5f);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < V; ++j) EXPECT_FLOAT_EQ(g[r * V + j], 0.5f * (p[r * V + j] - (j == lab[r])));
}

// The training head's fused pass (softmax_cross_entropy_with_grad) is the forward then the
// backward, operation for operation: the same bits, on rows long enough to take the threads.
TEST(Kernels, SoftmaxCrossEntropyWithGradIsForwardThenBackward) {
  const int rows = 40, V = 5003;
  auto x = randn(rows * V, 11, 4.0f);
  std::vector<int32_t> lab(rows);
  for (int r = 0; r < rows; ++r) lab[r] = (r * 997) % V;
  for (int threads : {1, 2}) {
    set_threads(threads);
    auto two = x, one = x;
    std::vector<float> loss_two(rows), loss_one(rows);
    softmax_cross_entropy_forward(two.data(), loss_two.data(), lab.data(), rows, V);
    softmax_cross_entropy_backward(two.data(), lab.data(), rows, V, 0.125f);
    softmax_cross_entropy_with_grad(one.data(), loss_one.data(), lab.data(), rows, V, 0.125f);
    EXPECT_EQ(0, std::memcmp(two.data(), one.data(), two.size() * sizeof(float))) << threads;
    EXPECT_EQ(0, std::memcmp(loss_two.data(), loss_one.data(), rows * sizeof(float))) << threads;
  }
}

TEST(Kernels, ReductionsAreExactAndThreadCountIndependent) {
  const int rows = 333, cols = 200;
  auto x = randn(rows * cols, 9);
  std::vector<float> a(cols, 1.0f), b(cols, 1.0f);
  set_threads(1);
  col_sum_accumulate(a.data(), x.data(), rows, cols);
  double s1 = sum_squares(x.data(), rows * cols);
  set_threads(2);
  col_sum_accumulate(b.data(), x.data(), rows, cols);
  double s2 = sum_squares(x.data(), rows * cols);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), cols * sizeof(float)));
  EXPECT_EQ(s1, s2);
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  EXPECT_NEAR(s1, ss, 1e-9 * ss);
  for (int c = 0; c < cols; ++c) {
    double s = 1;
    for (int r = 0; r < rows; ++r) s += x[r * cols + c];
    EXPECT_NEAR(a[c], s, 1e-4);
  }
}

TEST(Rng, CounterBasedNormalsAreDeterministicAndStandard) {
  CounterRng a{stream_key(7, "w")}, b{stream_key(7, "w")}, c{stream_key(8, "w")}, d{stream_key(7, "v")};
  EXPECT_EQ(a.normal(123), b.normal(123));
  EXPECT_NE(a.normal(123), c.normal(123));
  EXPECT_NE(a.normal(123), d.normal(123));
  const int n = 200000;
  double s = 0, s2 = 0;
  for (int i = 0; i < n; ++i) {
    double v = a.normal(i);
    s += v;
    s2 += v * v;
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);        // 4.5 standard errors
  EXPECT_NEAR(s2 / n, 1.0, 0.015);
  double u = 0;
  for (int i = 0; i < n; ++i) u += a.uniform(i);
  EXPECT_NEAR(u / n, 0.5, 0.003);
}

TEST(Kernels, SplitGemmMatchesNaiveAndBlas) {
  set_threads(2);
  // Tall (split by rows) and wide (split by columns) products, all transposes.
  for (auto [m, n, k] : {std::tuple{301, 40, 150}, std::tuple{37, 290, 160}}) {
    auto a = randn(m * k, 11), b = randn(k * n, 12);
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        std::vector<float> c(m * n, 1.0f), r(m * n, 1.0f);
        gemm(ta, tb, m, n, k, 1.5f, a.data(), ta ? m : k, b.data(), tb ? k : n, 1.0f, c.data(), n);
        blas_gemm(ta, tb, m, n, k, 1.5f, a.data(), ta ? m : k, b.data(), tb ? k : n, 1.0f, r.data(), n);
        for (int i = 0; i < m; i += 7)
          for (int j = 0; j < n; ++j) {
            double s = 0;
            for (int p = 0; p < k; ++p) s += double(ta ? a[p * m + i] : a[i * k + p]) * (tb ? b[j * k + p] : b[p * n + j]);
            ASSERT_NEAR(c[i * n + j], 1.5 * s + 1.0, 1e-3) << m << "x" << n << " " << ta << tb;
          }
        for (int i = 0; i < m * n; ++i) ASSERT_NEAR(c[i], r[i], 1e-3);
      }
  }
}
