// The scaling convention of kfac_layer.hpp: kron(B, A) against the empirical Fisher built densely
// in double from per-token gradients obtained by finite differences of a softmax cross-entropy
// through a Linear layer.
#include "dense.hpp"
#include "kfac/kfac_layer.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace pf {
namespace {

using dense::Mat;

// A Linear layer y = W x + b followed by softmax cross-entropy, in double.
struct LinearCE {
  int64_t d_in, d_out;
  std::vector<double> w, b;  // w [d_out, d_in] row-major

  std::vector<double> logits(const std::vector<double>& wv, const double* x) const {
    std::vector<double> y(d_out);
    for (int64_t o = 0; o < d_out; ++o) {
      y[o] = b[o];
      for (int64_t i = 0; i < d_in; ++i) y[o] += wv[o * d_in + i] * x[i];
    }
    return y;
  }
  double loss(const std::vector<double>& wv, const double* x, int label) const {
    std::vector<double> y = logits(wv, x);
    double mx = y[0], s = 0;
    for (double v : y) mx = std::max(mx, v);
    for (double v : y) s += std::exp(v - mx);
    return mx + std::log(s) - y[label];
  }
  // e = dl/dy = softmax(y) - onehot(label), analytic.
  std::vector<double> dl_dy(const double* x, int label) const {
    std::vector<double> y = logits(w, x);
    double mx = y[0], s = 0;
    for (double v : y) mx = std::max(mx, v);
    for (double v : y) s += std::exp(v - mx);
    std::vector<double> e(d_out);
    for (int64_t o = 0; o < d_out; ++o) e[o] = std::exp(y[o] - mx) / s - (o == label ? 1.0 : 0.0);
    return e;
  }
  // dl/dW by central differences, flattened row-major (index o * d_in + i).
  std::vector<double> dl_dw_fd(const double* x, int label) const {
    const double h = 1e-5;
    std::vector<double> grad(w.size()), wp = w;
    for (size_t k = 0; k < w.size(); ++k) {
      wp[k] = w[k] + h;
      double up = loss(wp, x, label);
      wp[k] = w[k] - h;
      double down = loss(wp, x, label);
      wp[k] = w[k];
      grad[k] = (up - down) / (2 * h);
    }
    return grad;
  }
};

LinearCE make_layer(int64_t d_in, int64_t d_out, uint32_t seed) {
  Tensor w = dense::randn({d_out, d_in}, seed, 0.5f), b = dense::randn({d_out}, seed + 1, 0.5f);
  return {d_in, d_out, std::vector<double>(w.begin(), w.end()), std::vector<double>(b.begin(), b.end())};
}

// (1/T) sum_t w_t w_t^T for per-token gradient vectors w_t.
Mat empirical_fisher(const std::vector<std::vector<double>>& per_token) {
  const int64_t p = static_cast<int64_t>(per_token[0].size());
  Mat f(p, p);
  for (const auto& g : per_token)
    for (int64_t i = 0; i < p; ++i)
      for (int64_t j = 0; j < p; ++j) f(i, j) += g[i] * g[j] / static_cast<double>(per_token.size());
  return f;
}

Mat kron_ba(const KfacLayer& layer) {
  return dense::kron(dense::from_tensor(layer.b().value()), dense::from_tensor(layer.a().value()));
}

TEST(KfacScaling, CurvatureScaleValues) {
  CurvatureScale s = curvature_scale(8, 0.25);  // T = 8 tokens, n = 4 loss positions
  EXPECT_EQ(s.a, 0.125f);
  EXPECT_EQ(s.b, 2.0f);  // n^2 / T
  CurvatureScale one = curvature_scale(1, 1.0);
  EXPECT_EQ(one.a, 1.0f);
  EXPECT_EQ(one.b, 1.0f);
}

// One example (one token, loss scale 1): its Fisher block vec(dW) vec(dW)^T is exactly kron(B, A)
// for the row-major flattening of W [d_out, d_in].
TEST(KfacScaling, OneExampleFisherBlockIsKronBA) {
  const int64_t d_in = 4, d_out = 3;
  LinearCE net = make_layer(d_in, d_out, 11);
  Tensor x = dense::randn({1, d_in}, 12);
  const int label = 2;
  std::vector<double> xd(x.begin(), x.end());

  std::vector<double> e = net.dl_dy(xd.data(), label);
  std::vector<double> dw = net.dl_dw_fd(xd.data(), label);
  // The chain rule the tap relies on: dW = e x^T (checks the finite differences too).
  for (int64_t o = 0; o < d_out; ++o)
    for (int64_t i = 0; i < d_in; ++i) ASSERT_NEAR(dw[o * d_in + i], e[o] * xd[i], 1e-8);

  Tensor g({1, d_out});
  for (int64_t o = 0; o < d_out; ++o) g[o] = static_cast<float>(e[o]);  // loss scale 1: g = e
  KfacLayer layer("l", d_in, d_out);
  layer.update_curvature(x.data(), g.data(), 1, curvature_scale(1, 1.0));
  layer.finish_curvature();

  Mat fisher = empirical_fisher({dw});
  EXPECT_LT(dense::max_abs_diff(kron_ba(layer), fisher), 1e-6);
  // The other order is the layout twin for column-major vec(W): it must not match here.
  Mat twin = dense::kron(dense::from_tensor(layer.a().value()), dense::from_tensor(layer.b().value()));
  EXPECT_GT(dense::max_abs_diff(twin, fisher), 1e-3);
}

struct Tokens {
  Tensor x, g;                                   // float, what the taps deliver: [T, d_in], [T, d_out]
  std::vector<std::vector<double>> e;            // dl_t/dy_t (0 for tokens without a loss)
  std::vector<std::vector<double>> per_token_dw; // dl_t/dW by finite differences
  double loss_scale = 0;
};

// T tokens through the layer; labels < 0 carry no loss. The step's loss is
// loss_scale * sum_t l_t with loss_scale = 1 / (tokens with a loss), as the project's head does.
Tokens run_tokens(const LinearCE& net, const Tensor& x, const std::vector<int>& labels) {
  const int64_t t_count = x.dim(0);
  Tokens out;
  out.x = x;
  out.g = Tensor({t_count, net.d_out});
  int n = 0;
  for (int l : labels) n += (l >= 0);
  out.loss_scale = 1.0 / n;
  for (int64_t t = 0; t < t_count; ++t) {
    std::vector<double> xd(x.begin() + t * net.d_in, x.begin() + (t + 1) * net.d_in);
    std::vector<double> e(net.d_out, 0.0), dw(net.d_out * net.d_in, 0.0);
    if (labels[t] >= 0) {
      e = net.dl_dy(xd.data(), labels[t]);
      dw = net.dl_dw_fd(xd.data(), labels[t]);
    }
    for (int64_t o = 0; o < net.d_out; ++o) out.g[t * net.d_out + o] = static_cast<float>(out.loss_scale * e[o]);
    out.e.push_back(e);
    out.per_token_dw.push_back(dw);
  }
  return out;
}

// When every token has the same input, the Kronecker factorisation is exact: the empirical Fisher
// over the T tokens, (1/T) sum_t vec(dW_t) vec(dW_t)^T, equals kron(B, A). This pins down the
// normalisation of both factors (A an average, B = 1/(T s^2) sum g g^T).
TEST(KfacScaling, MultiTokenSharedInputEqualsEmpiricalFisher) {
  const int64_t d_in = 3, d_out = 4, T = 6;
  LinearCE net = make_layer(d_in, d_out, 21);
  Tensor one = dense::randn({1, d_in}, 22);
  Tensor x({T, d_in});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < d_in; ++i) x[t * d_in + i] = one[i];
  // Same input but different targets, two tokens without a loss: n = 4 of T = 6.
  Tokens tok = run_tokens(net, x, {0, 3, -1, 1, 3, -1});

  KfacLayer layer("l", d_in, d_out);
  layer.update_curvature(tok.x.data(), tok.g.data(), T, curvature_scale(T, tok.loss_scale));
  layer.finish_curvature();
  EXPECT_LT(dense::max_abs_diff(kron_ba(layer), empirical_fisher(tok.per_token_dw)), 1e-6);
}

// In general kron(B, A) = E_t E_u [vec(e_t x_u^T) vec(e_t x_u^T)^T] (errors and inputs taken as
// independent: the K-FAC approximation); accumulating the tokens in two micro-batches gives the
// same factors.
TEST(KfacScaling, MultiTokenMatchesIndependentExpectation) {
  const int64_t d_in = 4, d_out = 3, T = 7;
  LinearCE net = make_layer(d_in, d_out, 31);
  Tensor x = dense::randn({T, d_in}, 32);
  Tokens tok = run_tokens(net, x, {2, -1, 0, 1, 1, -1, 2});
  for (int64_t t = 0; t < T; ++t)  // the per-token gradients are e_t x_t^T
    for (int64_t o = 0; o < d_out; ++o)
      for (int64_t i = 0; i < d_in; ++i)
        ASSERT_NEAR(tok.per_token_dw[t][o * d_in + i], tok.e[t][o] * x[t * d_in + i], 1e-8);

  Mat ref(d_out * d_in, d_out * d_in);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t u = 0; u < T; ++u) {
      std::vector<double> w(d_out * d_in);
      for (int64_t o = 0; o < d_out; ++o)
        for (int64_t i = 0; i < d_in; ++i) w[o * d_in + i] = tok.e[t][o] * x[u * d_in + i];
      for (size_t p = 0; p < w.size(); ++p)
        for (size_t q = 0; q < w.size(); ++q) ref(p, q) += w[p] * w[q] / double(T * T);
    }

  const CurvatureScale s = curvature_scale(T, tok.loss_scale);
  KfacLayer layer("l", d_in, d_out);
  const int64_t first = 3;  // micro-batch 0: rows 0..2, micro-batch 1: rows 3..6
  layer.update_curvature(tok.x.data(), tok.g.data(), first, s);
  layer.update_curvature(tok.x.data() + first * d_in, tok.g.data() + first * d_out, T - first, s);
  EXPECT_EQ(layer.a().pending_micro_batches(), 2);
  layer.finish_curvature();
  EXPECT_LT(dense::max_abs_diff(kron_ba(layer), ref), 1e-6);
  // ... and it is not the empirical Fisher itself (the approximation is real here).
  EXPECT_GT(dense::max_abs_diff(kron_ba(layer), empirical_fisher(tok.per_token_dw)), 1e-3);
}

}  // namespace
}  // namespace pf
