#pragma once
// SOAP against an independent double-precision reference written from the paper's algorithm
// (Vyas et al. 2024, Algorithm 1; the authors' soap.py for the first step, the sort and the
// order of the updates): Jacobi's eigenvalue method for the first bases and Gram-Schmidt for the
// power iteration's QR, no LAPACK. Eigenvectors are defined up to sign, and SOAP's update does
// not depend on the signs; where an eigenvalue is repeated the basis is arbitrary, so the test's
// gradients keep every repeated eigenvalue (the null space of a wide weight's R) out of reach:
// each gradient's rows lie in one fixed row space.
// tests/optim/test_soap.cpp compares our SOAP with it.
#include "../kfac/dense.hpp"
#include "noise.hpp"
#include "core/blas.hpp"
#include "optim/optimizer.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>

namespace soap_ref {

using namespace pf;
using pf::test::noise;

using M = pf::dense::Mat;

inline M t(const M& x) {
  M y(x.cols, x.rows);
  for (int64_t i = 0; i < x.rows; ++i)
    for (int64_t j = 0; j < x.cols; ++j) y(j, i) = x(i, j);
  return y;
}

inline M mul(const M& x, const M& y) {
  M z(x.rows, y.cols);
  for (int64_t i = 0; i < x.rows; ++i)
    for (int64_t k = 0; k < x.cols; ++k)
      for (int64_t j = 0; j < y.cols; ++j) z(i, j) += x(i, k) * y(k, j);
  return z;
}

// Cyclic Jacobi: the eigenvectors of symmetric S as columns, by decreasing eigenvalue.
inline M jacobi_eigenvectors(M s) {
  const int64_t n = s.rows;
  M v(n, n);
  for (int64_t i = 0; i < n; ++i) v(i, i) = 1;
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t q = p + 1; q < n; ++q) off += s(p, q) * s(p, q);
    if (off < 1e-60) break;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t q = p + 1; q < n; ++q) {
        if (s(p, q) == 0) continue;
        const double th = (s(q, q) - s(p, p)) / (2 * s(p, q));
        const double tn = (th >= 0 ? 1 : -1) / (std::abs(th) + std::sqrt(th * th + 1));
        const double c = 1 / std::sqrt(tn * tn + 1), sn = tn * c;
        for (int64_t k = 0; k < n; ++k) {  // S = J^T S J, V = V J
          const double a = s(k, p), b = s(k, q);
          s(k, p) = c * a - sn * b, s(k, q) = sn * a + c * b;
        }
        for (int64_t k = 0; k < n; ++k) {
          const double a = s(p, k), b = s(q, k);
          s(p, k) = c * a - sn * b, s(q, k) = sn * a + c * b;
        }
        for (int64_t k = 0; k < n; ++k) {
          const double a = v(k, p), b = v(k, q);
          v(k, p) = c * a - sn * b, v(k, q) = sn * a + c * b;
        }
      }
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s(a, a) > s(b, b); });
  M out(n, n);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) out(i, j) = v(i, order[j]);
  return out;
}

// Q of P = Q R by modified Gram-Schmidt, twice over (columns in order).
inline M gram_schmidt(const M& p) {
  M q = p;
  for (int64_t j = 0; j < q.cols; ++j) {
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t k = 0; k < j; ++k) {
        double d = 0;
        for (int64_t i = 0; i < q.rows; ++i) d += q(i, k) * q(i, j);
        for (int64_t i = 0; i < q.rows; ++i) q(i, j) -= d * q(i, k);
      }
    double nn = 0;
    for (int64_t i = 0; i < q.rows; ++i) nn += q(i, j) * q(i, j);
    for (int64_t i = 0; i < q.rows; ++i) q(i, j) /= std::sqrt(nn);
  }
  return q;
}

// One parameter of the reference: AdamW's, or SOAP's for a Linear weight.
struct RefParam {
  M w, m, v, L, R, QL, QR;
  bool linear = false, decay = true, left = false, right = false;
};

struct Hyper {
  double lr = 2e-2, b1 = 0.9, b2 = 0.99, eps = 1e-3, wd = 0.1, clip = 1.0, shampoo = 0.9;
  int freq = 2, max_dim = 10000;
  bool by_units = false;  // the bases move only when refresh_side is called
  bool skip = false;      // precond.placement = skip: L and R take only the refresh steps' gradients
};

// One power iteration of basis q of statistic s (the paper's get_orthogonal_matrix_QR): columns
// sorted by q_j^T s q_j, v's rows (`rows`) or columns permuted alike, q = qr(s q).
inline void power_refresh(RefParam& p, const M& s, M& q, bool rows) {
  const M sq = mul(s, q);
  std::vector<int64_t> order(static_cast<size_t>(q.cols));
  std::vector<double> est(static_cast<size_t>(q.cols), 0.0);
  for (int64_t i = 0; i < q.rows; ++i)
    for (int64_t j = 0; j < q.cols; ++j) est[j] += q(i, j) * sq(i, j);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return est[a] > est[b]; });
  M ps(q.rows, q.cols), v = p.v;
  for (int64_t i = 0; i < q.rows; ++i)
    for (int64_t j = 0; j < q.cols; ++j) ps(i, j) = sq(i, order[j]);
  for (int64_t i = 0; i < v.rows; ++i)
    for (int64_t j = 0; j < v.cols; ++j) p.v(i, j) = rows ? v(order[i], j) : v(i, order[j]);
  q = gram_schmidt(ps);
}

// One factor's refresh between updates (side 0: L, 1: R): m = Q^T (Q_old m) on that side.
inline void refresh_side(RefParam& p, int side) {
  if (side == 0 && p.left) {
    const M full = mul(p.QL, p.m);
    power_refresh(p, p.L, p.QL, true);
    p.m = mul(t(p.QL), full);
  }
  if (side == 1 && p.right) {
    const M full = mul(p.m, t(p.QR));
    power_refresh(p, p.R, p.QR, false);
    p.m = mul(full, p.QR);
  }
}

// The paper's step for one weight; k counts SOAP's steps (0: the first, which only sets up).
inline void soap_ref_step(RefParam& p, const M& g, int k, const Hyper& h) {
  auto rot = [&](const M& x, bool back) {
    M y = x;
    if (p.left) y = mul(back ? p.QL : t(p.QL), y);
    if (p.right) y = mul(y, back ? t(p.QR) : p.QR);
    return y;
  };
  auto stats = [&] {
    const M gl = mul(g, t(g)), gr = mul(t(g), g);
    for (size_t i = 0; i < p.L.v.size(); ++i) p.L.v[i] = h.shampoo * p.L.v[i] + (1 - h.shampoo) * gl.v[i];
    for (size_t i = 0; i < p.R.v.size(); ++i) p.R.v[i] = h.shampoo * p.R.v[i] + (1 - h.shampoo) * gr.v[i];
  };
  if (k == 0) {
    stats();
    if (p.left) p.QL = jacobi_eigenvectors(p.L);
    if (p.right) p.QR = jacobi_eigenvectors(p.R);
    return;
  }
  const M gp = rot(g, false);
  M d(g.rows, g.cols);
  for (size_t i = 0; i < gp.v.size(); ++i) {
    p.m.v[i] = h.b1 * p.m.v[i] + (1 - h.b1) * gp.v[i];
    p.v.v[i] = h.b2 * p.v.v[i] + (1 - h.b2) * gp.v[i] * gp.v[i];
    d.v[i] = p.m.v[i] / (std::sqrt(p.v.v[i]) + h.eps);
  }
  const M n = rot(d, true);
  const double step = h.lr * std::sqrt(1 - std::pow(h.b2, k)) / (1 - std::pow(h.b1, k));
  for (size_t i = 0; i < p.w.v.size(); ++i) p.w.v[i] = (p.w.v[i] - step * n.v[i]) * (1 - h.lr * h.wd);
  if (!h.skip || k % h.freq == 0) stats();
  if (h.by_units || k % h.freq != 0) return;
  const M m_orig = rot(p.m, true);
  if (p.left) power_refresh(p, p.L, p.QL, true);
  if (p.right) power_refresh(p, p.R, p.QR, false);
  p.m = rot(m_orig, false);
}

inline void adamw_ref_step(RefParam& p, const M& g, int t, const Hyper& h) {
  for (size_t i = 0; i < p.w.v.size(); ++i) {
    if (p.decay) p.w.v[i] *= 1 - h.lr * h.wd;
    p.m.v[i] = h.b1 * p.m.v[i] + (1 - h.b1) * g.v[i];
    p.v.v[i] = h.b2 * p.v.v[i] + (1 - h.b2) * g.v[i] * g.v[i];
    const double mh = p.m.v[i] / (1 - std::pow(h.b1, t)), vh = p.v.v[i] / (1 - std::pow(h.b2, t));
    p.w.v[i] -= h.lr * mh / (std::sqrt(vh) + h.eps);
  }
}

// Parameters, ours and the reference's, with the gradients of each step.
struct Stack {
  std::vector<std::unique_ptr<Param>> owned;
  std::vector<Param*> params;
  std::vector<RefParam> ref;
  std::vector<M> basis;  // a Linear weight's gradients are C_t B: their rows lie in B's row space
  Hyper h;

  void add(const std::string& name, Shape s, bool linear, bool decay) {
    owned.push_back(std::make_unique<Param>(name, s, decay));
    Param& p = *owned.back();
    p.linear = linear;
    params.push_back(&p);
    const int64_t r = s[0], c = s.size() > 1 ? s[1] : 1;
    RefParam q;
    q.w = M(r, c), q.m = M(r, c), q.v = M(r, c);
    q.linear = linear, q.decay = decay, q.left = linear && r <= h.max_dim, q.right = linear && c <= h.max_dim;
    if (q.left) q.L = M(r, r);
    if (q.right) q.R = M(c, c);
    for (int64_t i = 0; i < p.value.numel(); ++i)
      q.w.v[i] = p.value[i] = static_cast<float>(0.5 * noise(7, i + 1000 * params.size()));
    M b(std::min(r, c), c);
    for (double& x : b.v) x = noise(11, &x - b.v.data() + 977 * params.size());
    basis.push_back(b);
    ref.push_back(q);
  }

  // Step t's gradients (a Linear weight's [r, c] with r <= c: C_t B; the rest anything), scaled
  // to the global norm `norm`; returns the reference's, clipped.
  std::vector<M> set_grads(int step, double norm) {
    std::vector<M> g;
    double sq = 0;
    for (size_t k = 0; k < params.size(); ++k) {
      const RefParam& q = ref[k];
      M x(q.w.rows, q.w.cols);
      if (q.linear) {
        M c(q.w.rows, basis[k].rows);
        for (size_t i = 0; i < c.v.size(); ++i) c.v[i] = noise(100 + step, i + 7919 * k);
        x = mul(c, basis[k]);
      } else {
        for (size_t i = 0; i < x.v.size(); ++i) x.v[i] = noise(100 + step, i + 7919 * k);
      }
      for (double v : x.v) sq += v * v;
      g.push_back(x);
    }
    const double scale = norm / std::sqrt(sq);
    for (size_t k = 0; k < params.size(); ++k)
      for (size_t i = 0; i < g[k].v.size(); ++i) g[k].v[i] = params[k]->grad[i] = static_cast<float>(g[k].v[i] * scale);
    double sq32 = 0;  // the reference takes the float gradients our optimizer sees
    for (size_t k = 0; k < params.size(); ++k)
      for (double& v : g[k].v) v = static_cast<float>(v), sq32 += v * v;
    const double n = std::sqrt(sq32);
    if (h.clip > 0 && n > h.clip)
      for (M& x : g)
        for (double& v : x.v) v *= h.clip / n;
    return g;
  }

  void ref_step(int t, double norm) {
    const std::vector<M> g = set_grads(t, norm);
    for (size_t k = 0; k < ref.size(); ++k)
      if (ref[k].linear) soap_ref_step(ref[k], g[k], t - 1, h);
      else adamw_ref_step(ref[k], g[k], t, h);
  }

  std::unique_ptr<Optimizer> ours() const {
    OptimConfig c;
    c.name = OptimName::Soap;
    c.lr = h.lr, c.beta1 = h.b1, c.beta2 = h.b2, c.eps = h.eps, c.weight_decay = h.wd, c.grad_clip = h.clip;
    c.soap.shampoo_beta = h.shampoo, c.soap.precondition_frequency = h.freq, c.soap.max_precond_dim = h.max_dim;
    std::unique_ptr<Optimizer> o = make_optimizer(c);
    dynamic_cast<Soap&>(*o).statistics_at_refreshes_only(h.skip);
    return o;
  }

  // Largest |ours - reference| over every weight.
  double worst() const {
    double w = 0;
    for (size_t k = 0; k < params.size(); ++k)
      for (int64_t i = 0; i < params[k]->value.numel(); ++i) w = std::max(w, std::abs(params[k]->value[i] - ref[k].w.v[i]));
    return w;
  }

  // What float32 rounding allows after `steps` steps: each product or sum of the rotations rounds
  // by u = 2^-24 relative, d terms deep (d the longest rotated side); where Adam's second moment
  // is 0 (a wide weight's coordinates outside its gradients' row space, the rest of a
  // coordinate's few steps) that rounding, at most d u |g| with |g| <= 1 (clipped), is divided by
  // eps instead of sqrt(v), and a step moves the weight by lr times it.
  double tolerance(int steps, int64_t d) const { return steps * h.lr * d * std::ldexp(1.0, -24) / h.eps; }
};

constexpr double kNorms[] = {3.0, 0.4, 0.9, 25.0, 0.05, 1.7, 0.8, 2.2};

// Steps 1..steps of ours and the reference side by side, each within the float32 bound (sides of
// at most d).
inline void expect_steps_match_reference(Stack& s, Optimizer& opt, int steps, int64_t d) {
  for (int t = 1; t <= steps; ++t) {
    s.ref_step(t, kNorms[t - 1]);
    opt.step(s.params, s.h.lr);
    const double w = s.worst();
    std::printf("step %d: largest difference %.3g (tolerance %.3g)\n", t, w, s.tolerance(t, d));
    EXPECT_LT(w, s.tolerance(t, d)) << "step " << t;
  }
}

}  // namespace soap_ref
