#pragma once
// Dense double-precision references for the K-FAC and optimizer tests: small matrices, written plainly.
#include "core/tensor.hpp"

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

namespace pf::dense {

// Row-major double matrix.
struct Mat {
  int64_t rows = 0, cols = 0;
  std::vector<double> v;
  Mat() = default;
  Mat(int64_t r, int64_t c) : rows(r), cols(c), v(static_cast<size_t>(r * c), 0.0) {}
  double& operator()(int64_t r, int64_t c) { return v[r * cols + c]; }
  double operator()(int64_t r, int64_t c) const { return v[r * cols + c]; }
};

inline Mat identity(int64_t n) {
  Mat m(n, n);
  for (int64_t i = 0; i < n; ++i) m(i, i) = 1;
  return m;
}

// A float tensor [r, c] (or [n] as a diagonal n x n when as_diag) as a double matrix.
inline Mat from_tensor(const Tensor& t, bool as_diag = false) {
  if (as_diag || t.rank() == 1) {
    Mat m(t.dim(0), t.dim(0));
    for (int64_t i = 0; i < t.dim(0); ++i) m(i, i) = t[i];
    return m;
  }
  Mat m(t.dim(0), t.dim(1));
  for (int64_t i = 0; i < t.numel(); ++i) m.v[i] = t[i];
  return m;
}

// kron(P, Q): (P.rows*Q.rows) x (P.cols*Q.cols), block (i, j) = P(i, j) * Q.
inline Mat kron(const Mat& p, const Mat& q) {
  Mat k(p.rows * q.rows, p.cols * q.cols);
  for (int64_t i = 0; i < p.rows; ++i)
    for (int64_t j = 0; j < p.cols; ++j)
      for (int64_t a = 0; a < q.rows; ++a)
        for (int64_t b = 0; b < q.cols; ++b) k(i * q.rows + a, j * q.cols + b) = p(i, j) * q(a, b);
  return k;
}

inline Mat add_diag(Mat m, double lambda) {
  for (int64_t i = 0; i < m.rows; ++i) m(i, i) += lambda;
  return m;
}

inline double trace(const Mat& m) {
  double t = 0;
  for (int64_t i = 0; i < m.rows; ++i) t += m(i, i);
  return t;
}

// Solves M x = b by Gaussian elimination with partial pivoting.
inline std::vector<double> solve(Mat m, std::vector<double> b) {
  const int64_t n = m.rows;
  for (int64_t c = 0; c < n; ++c) {
    int64_t p = c;
    for (int64_t r = c + 1; r < n; ++r)
      if (std::abs(m(r, c)) > std::abs(m(p, c))) p = r;
    if (m(p, c) == 0) throw std::runtime_error("singular");
    for (int64_t k = 0; k < n; ++k) std::swap(m(c, k), m(p, k));
    std::swap(b[c], b[p]);
    for (int64_t r = c + 1; r < n; ++r) {
      double f = m(r, c) / m(c, c);
      for (int64_t k = c; k < n; ++k) m(r, k) -= f * m(c, k);
      b[r] -= f * b[c];
    }
  }
  std::vector<double> x(n);
  for (int64_t r = n - 1; r >= 0; --r) {
    double s = b[r];
    for (int64_t k = r + 1; k < n; ++k) s -= m(r, k) * x[k];
    x[r] = s / m(r, r);
  }
  return x;
}

inline Mat inverse(const Mat& m) {
  Mat inv(m.rows, m.rows);
  for (int64_t j = 0; j < m.rows; ++j) {
    std::vector<double> e(m.rows, 0.0);
    e[j] = 1;
    std::vector<double> col = solve(m, e);
    for (int64_t i = 0; i < m.rows; ++i) inv(i, j) = col[i];
  }
  return inv;
}

// Largest |a - b| over all entries.
inline double max_abs_diff(const Mat& a, const Mat& b) {
  if (a.rows != b.rows || a.cols != b.cols) throw std::runtime_error("shape mismatch");
  double d = 0;
  for (size_t i = 0; i < a.v.size(); ++i) d = std::max(d, std::abs(a.v[i] - b.v[i]));
  return d;
}

// |a - b| / |b| in the 2-norm.
inline double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

// A float tensor of the given shape filled with N(0, 1) from a fixed seed.
inline Tensor randn(Shape shape, uint32_t seed, float scale = 1.0f) {
  Tensor t(std::move(shape));
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& x : t.span()) x = scale * nd(gen);
  return t;
}

}  // namespace pf::dense
