// The preconditioned gradient against a dense solve in double of
// ((B + sqrt(gamma)/pi I) kron (A + sqrt(gamma) pi I)) v = vec_rowmajor(G), in its three forms:
// dense B, diagonal B (B replaced by its diagonal), block-diagonal factors. And the KL-clip.
#include "dense.hpp"
#include "kfac/kfac_layer.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace pf {
namespace {

using dense::Mat;

struct Step {
  Tensor x, g;  // [T, d_in], [T, d_out]
  double loss_scale;
};

Step make_step(int64_t t, int64_t d_in, int64_t d_out, uint32_t seed) {
  return {dense::randn({t, d_in}, seed), dense::randn({t, d_out}, seed + 1, 0.1f), 0.1};
}

// The factors of the convention, in double from the same float inputs.
Mat factor_ref(const Tensor& rows, double scale) {
  const int64_t t = rows.dim(0), d = rows.dim(1);
  Mat m(d, d);
  for (int64_t r = 0; r < t; ++r)
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = 0; j < d; ++j) m(i, j) += scale * double(rows[r * d + i]) * double(rows[r * d + j]);
  return m;
}

// Keeps only the diagonal blocks of the given sizes.
Mat block_diag(const Mat& m, const std::vector<FactorBlock>& blocks) {
  Mat out(m.rows, m.cols);
  for (const FactorBlock& b : blocks)
    for (int64_t i = b.offset; i < b.offset + b.size; ++i)
      for (int64_t j = b.offset; j < b.offset + b.size; ++j) out(i, j) = m(i, j);
  return out;
}

struct Reference {
  std::vector<double> weight, bias;  // preconditioned gradients
  double vg = 0;
};

// Dense solve with the damped Kronecker product of (possibly diagonal / block-diagonal) factors.
Reference dense_precondition(const Mat& a, const Mat& b, double gamma, const Tensor& gw, const Tensor& gb) {
  const double pi = std::sqrt((dense::trace(a) / a.rows) / (dense::trace(b) / b.rows));
  const Mat ad = dense::add_diag(a, std::sqrt(gamma) * pi), bd = dense::add_diag(b, std::sqrt(gamma) / pi);
  Reference r;
  std::vector<double> g(gw.begin(), gw.end()), gbias(gb.begin(), gb.end());
  r.weight = dense::solve(dense::kron(bd, ad), g);
  r.bias = dense::solve(bd, gbias);
  for (size_t i = 0; i < g.size(); ++i) r.vg += r.weight[i] * g[i];
  for (size_t i = 0; i < gbias.size(); ++i) r.vg += r.bias[i] * gbias[i];
  return r;
}

struct Case {
  int64_t d_in, d_out, tokens;
  KfacLayerOptions opt;
};

// Runs curvature (two micro-batches), inversion and precondition; checks against the dense solve.
void check_against_dense(const Case& c, double gamma, bool diag_b, uint32_t seed) {
  Step st = make_step(c.tokens, c.d_in, c.d_out, seed);
  KfacLayer layer("layer", c.d_in, c.d_out, c.opt);
  ASSERT_EQ(layer.diagonal_b(), diag_b);
  const CurvatureScale s = curvature_scale(c.tokens, st.loss_scale);
  const int64_t half = c.tokens / 2;
  layer.update_curvature(st.x.data(), st.g.data(), half, s);
  layer.update_curvature(st.x.data() + half * c.d_in, st.g.data() + half * c.d_out, c.tokens - half, s);
  layer.finish_curvature();
  ASSERT_EQ(layer.update_inverse(gamma).status, InvertStatus::Ok);

  Param w("w", {c.d_out, c.d_in}), bias("b", {c.d_out});
  w.grad = dense::randn({c.d_out, c.d_in}, seed + 7);
  bias.grad = dense::randn({c.d_out}, seed + 8);
  const Tensor gw = w.grad, gb = bias.grad;
  layer.precondition(w, &bias);

  Mat a = factor_ref(st.x, 1.0 / c.tokens);
  Mat b = factor_ref(st.g, 1.0 / (c.tokens * st.loss_scale * st.loss_scale));
  if (diag_b) {
    for (int64_t i = 0; i < b.rows; ++i)
      for (int64_t j = 0; j < b.cols; ++j)
        if (i != j) b(i, j) = 0;
  } else {
    b = block_diag(b, layer.b().blocks());
  }
  a = block_diag(a, layer.a().blocks());
  Reference ref = dense_precondition(a, b, gamma, gw, gb);
  EXPECT_LT(dense::rel_err(std::vector<double>(w.grad.begin(), w.grad.end()), ref.weight), 1e-5);
  EXPECT_LT(dense::rel_err(std::vector<double>(bias.grad.begin(), bias.grad.end()), ref.bias), 1e-5);
  EXPECT_NEAR(layer.last_vg(), ref.vg, 1e-5 * std::abs(ref.vg));
  // And the preconditioner really changed the gradient (not the identity).
  EXPECT_GT(dense::rel_err(std::vector<double>(gw.begin(), gw.end()), ref.weight), 1e-2);
}

TEST(KfacPrecondition, DenseFactorsEqualDampedKroneckerSolve) {
  check_against_dense({5, 4, 20, {}}, 0.01, false, 100);
  check_against_dense({3, 7, 9, {}}, 1e-3, false, 200);    // more outputs than inputs, few tokens
  check_against_dense({9, 66, 80, {}}, 0.01, false, 300);  // more than one chunk of rows
}

TEST(KfacPrecondition, DiagonalBEqualsSolveWithDiagonalOfB) {
  KfacLayerOptions opt;
  opt.diag_limit = 3;  // d_out 4 > 3: B keeps only its diagonal
  check_against_dense({5, 4, 20, opt}, 0.01, true, 400);
  KfacLayer wide("wide", 2, 11, opt);
  EXPECT_EQ(wide.b().value().shape(), Shape({11}));
  KfacLayer narrow("narrow", 2, 3, opt);
  EXPECT_FALSE(narrow.diagonal_b());
}

TEST(KfacPrecondition, BlockDiagonalFactorsEqualSolveWithBlockDiagonalFactors) {
  KfacLayerOptions opt;
  opt.blocks_a = 2;  // 5 -> 3 + 2
  opt.blocks_b = 3;  // 7 -> 3 + 2 + 2
  check_against_dense({5, 7, 24, opt}, 0.01, false, 500);
}

TEST(KfacPrecondition, BeforeAnyInversionTheGradientPassesThrough) {
  KfacLayer layer("l", 3, 2);
  Param w("w", {2, 3}), b("b", {2});
  w.grad = dense::randn({2, 3}, 1);
  b.grad = dense::randn({2}, 2);
  const Tensor gw = w.grad, gb = b.grad;
  layer.precondition(w, &b);
  for (int64_t i = 0; i < gw.numel(); ++i) EXPECT_EQ(w.grad[i], gw[i]);
  for (int64_t i = 0; i < gb.numel(); ++i) EXPECT_EQ(b.grad[i], gb[i]);
}

TEST(KfacKlClip, ScaleFormula) {
  EXPECT_EQ(kl_clip_scale(4.0, 0.5, 0.25), 0.5);     // sqrt(0.25 / |4 * 0.25|)
  EXPECT_EQ(kl_clip_scale(-4.0, 0.5, 0.25), 0.5);    // absolute value
  EXPECT_EQ(kl_clip_scale(4.0, 0.5, 4.0), 1.0);      // capped at 1
  EXPECT_EQ(kl_clip_scale(0.0, 0.5, 0.25), 1.0);     // nothing to clip
}

TEST(KfacKlClip, ScalesAllLayersByOneFactor) {
  std::vector<KfacLayer> layers;
  layers.emplace_back("l0", 4, 3);
  layers.emplace_back("l1", 3, 5);
  std::vector<Param> weights, biases;
  for (size_t l = 0; l < layers.size(); ++l) {
    const int64_t di = layers[l].d_in(), dout = layers[l].d_out();
    Step st = make_step(10, di, dout, 600 + 10 * l);
    layers[l].update_curvature(st.x.data(), st.g.data(), 10, curvature_scale(10, st.loss_scale));
    layers[l].finish_curvature();
    layers[l].update_inverse(0.01);
    weights.emplace_back("w", Shape{dout, di});
    biases.emplace_back("b", Shape{dout});
    weights.back().grad = dense::randn({dout, di}, 700 + l);
    biases.back().grad = dense::randn({dout}, 800 + l);
  }
  // v.g from the raw gradients, before preconditioning overwrites them.
  std::vector<Tensor> raw_w, raw_b;
  for (size_t l = 0; l < layers.size(); ++l) {
    raw_w.push_back(weights[l].grad);
    raw_b.push_back(biases[l].grad);
  }
  std::vector<Tensor> pre_w, pre_b;
  double vg_dense = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    layers[l].precondition(weights[l], &biases[l]);
    pre_w.push_back(weights[l].grad);
    pre_b.push_back(biases[l].grad);
    for (int64_t i = 0; i < raw_w[l].numel(); ++i) vg_dense += double(pre_w[l][i]) * raw_w[l][i];
    for (int64_t i = 0; i < raw_b[l].numel(); ++i) vg_dense += double(pre_b[l][i]) * raw_b[l][i];
  }
  const double lr = 0.1, kappa = 1e-5 * std::abs(vg_dense);  // forces nu = sqrt(1e-3)
  std::vector<KfacTarget> targets;
  for (size_t l = 0; l < layers.size(); ++l) targets.push_back({&layers[l], &weights[l], &biases[l]});
  const double nu = kl_clip(targets.data(), targets.size(), lr, kappa);
  EXPECT_NEAR(nu, std::sqrt(1e-3), 1e-6);
  const float nuf = static_cast<float>(nu);
  for (size_t l = 0; l < layers.size(); ++l) {
    for (int64_t i = 0; i < pre_w[l].numel(); ++i) EXPECT_EQ(weights[l].grad[i], pre_w[l][i] * nuf);
    for (int64_t i = 0; i < pre_b[l].numel(); ++i) EXPECT_EQ(biases[l].grad[i], pre_b[l][i] * nuf);
  }
}

}  // namespace
}  // namespace pf
