#include "kfac/factor.hpp"

#include "core/machine.hpp"

#include <cblas.h>
#include <lapacke.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

namespace pf {

std::vector<FactorBlock> split_blocks(int64_t d, int k) {
  PF_CHECK(k >= 1 && k <= std::max<int64_t>(d, 1), "{} blocks for a factor of size {}", k, d);
  std::vector<FactorBlock> out;
  int64_t offset = 0;
  for (int j = 0; j < k; ++j) {
    int64_t size = d / k + (j < d % k ? 1 : 0);
    out.push_back({offset, size});
    offset += size;
  }
  return out;
}

double curvature_flops(int64_t d, int k, int64_t rows, FactorKind kind) {
  if (kind == FactorKind::Diagonal) return static_cast<double>(rows) * d;
  double f = 0;
  for (const FactorBlock& b : split_blocks(d, k)) f += static_cast<double>(rows) * b.size * b.size;
  return f;
}

double inversion_flops(int64_t d, int k, FactorKind kind) {
  if (kind == FactorKind::Diagonal) return static_cast<double>(d);
  double f = 0;
  for (const FactorBlock& b : split_blocks(d, k)) f += static_cast<double>(b.size) * b.size * b.size;
  return f;
}

int blocks_for_budget(int64_t d, double max_block_flops) {
  for (int64_t k = 1; k < d; ++k) {
    double largest = static_cast<double>((d + k - 1) / k);
    if (largest * largest * largest <= max_block_flops) return static_cast<int>(k);
  }
  return static_cast<int>(std::max<int64_t>(d, 1));
}

const char* status_name(InvertStatus s) {
  switch (s) {
    case InvertStatus::Ok: return "ok";
    case InvertStatus::Raised: return "raised";
    case InvertStatus::Failed: return "failed";
    case InvertStatus::NonFinite: return "non-finite";
  }
  return "?";
}

namespace {

Shape factor_shape(int64_t d, FactorKind kind) {
  return kind == FactorKind::Dense ? Shape{d, d} : Shape{d};
}

void set_identity(Tensor& t, int64_t d, FactorKind kind) {
  if (kind == FactorKind::Diagonal) {
    t.fill(1.0f);
    return;
  }
  t.zero();
  for (int64_t i = 0; i < d; ++i) t[i * d + i] = 1.0f;
}

// The order LAPACK inverts a block of order n at: n + 1 for odd n where the loaded OpenBLAS kernels
// cannot invert odd orders (core/machine.hpp).
int64_t inverse_order(int64_t n) {
  static const bool odd_ok = kernel_inverts_odd_orders(blas_kernel_name());
  return odd_ok || n % 2 == 0 ? n : n + 1;
}

}  // namespace

KfacFactor::KfacFactor(std::string name, int64_t dim, FactorKind kind, int blocks, double ema_decay,
                       int max_retries)
    : name_(std::move(name)), dim_(dim), kind_(kind), ema_decay_(ema_decay), max_retries_(max_retries),
      value_(factor_shape(dim, kind)), inverse_(factor_shape(dim, kind)) {
  PF_CHECK(dim >= 1, "factor {}: dimension {}", name_, dim);
  PF_CHECK(ema_decay >= 0 && ema_decay < 1, "factor {}: ema decay {}", name_, ema_decay);
  PF_CHECK(max_retries >= 0, "factor {}: max_retries {}", name_, max_retries);
  if (ema_decay_ > 0) acc_ = Tensor(factor_shape(dim, kind));
  set_identity(inverse_, dim_, kind_);
  set_blocks(blocks);
}

void KfacFactor::set_blocks(int k) {
  blocks_ = split_blocks(dim_, k);
  int64_t largest = 0;
  for (const FactorBlock& b : blocks_) largest = std::max(largest, b.size);
  // Dense: room for a block padded to even order (inverse_order).
  work_ = Tensor(kind_ == FactorKind::Dense ? Shape{(largest + 1) * (largest + 1)} : Shape{largest});
  if (kind_ == FactorKind::Diagonal) return;
  // Drop what lies outside the new blocks: the factor is the block-diagonal approximation.
  std::vector<int> block_of(dim_);
  for (int j = 0; j < num_blocks(); ++j)
    for (int64_t i = 0; i < blocks_[j].size; ++i) block_of[blocks_[j].offset + i] = j;
  for (Tensor* t : {&value_, &acc_}) {
    if (t->empty()) continue;
    for (int64_t r = 0; r < dim_; ++r)
      for (int64_t c = 0; c < dim_; ++c)
        if (block_of[r] != block_of[c]) (*t)[r * dim_ + c] = 0.0f;
  }
}

// --- curvature ---

void KfacFactor::accumulate(const float* x, int64_t rows, int64_t ld, float scale) {
  PF_CHECK(ld >= dim_ && rows >= 0, "factor {}: accumulate rows {} ld {} dim {}", name_, rows, ld, dim_);
  Tensor& acc = accumulator();
  if (pending_ == 0) acc.zero();
  ++pending_;
  if (rows == 0) return;
  float* a = acc.data();
  if (kind_ == FactorKind::Diagonal) {
    for (int64_t t = 0; t < rows; ++t) {
      const float* xt = x + t * ld;
      for (int64_t i = 0; i < dim_; ++i) a[i] += scale * xt[i] * xt[i];
    }
    return;
  }
  // Row-major x [rows, ld]: acc_block += scale * x_block^T x_block, upper triangle.
  for (const FactorBlock& b : blocks_)
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, static_cast<blasint>(b.size),
                static_cast<blasint>(rows), scale, x + b.offset, static_cast<blasint>(ld), 1.0f,
                a + b.offset * dim_ + b.offset, static_cast<blasint>(dim_));
}

void KfacFactor::set_own_accumulator(bool on) {
  if (ema_decay_ > 0 || on == own_accumulator()) return;
  if (on) {
    acc_ = Tensor(value_.shape());
    if (pending_ > 0) acc_ = value_;
  } else {
    if (pending_ > 0) value_ = acc_;
    acc_ = Tensor();
  }
}

bool KfacFactor::commit() {
  if (pending_ == 0) return false;
  pending_ = 0;
  float* v = value_.data();
  if (own_accumulator()) {
    const float* a = acc_.data();
    const int64_t n = value_.numel();
    if (commits_ == 0 || ema_decay_ == 0) {
      std::memcpy(v, a, n * sizeof(float));
    } else {
      const float keep = static_cast<float>(ema_decay_), take = static_cast<float>(1.0 - ema_decay_);
      for (int64_t i = 0; i < n; ++i) v[i] = keep * v[i] + take * a[i];
    }
  }
  double tr = 0;
  if (kind_ == FactorKind::Diagonal) {
    for (int64_t i = 0; i < dim_; ++i) tr += v[i];
  } else {
    for (const FactorBlock& b : blocks_)  // mirror the upper triangle into the lower
      for (int64_t r = b.offset; r < b.offset + b.size; ++r)
        for (int64_t c = r + 1; c < b.offset + b.size; ++c) v[c * dim_ + r] = v[r * dim_ + c];
    for (int64_t i = 0; i < dim_; ++i) tr += v[i * dim_ + i];
  }
  trace_ = tr;
  ++commits_;
  return true;
}

void KfacFactor::set_value(const Tensor& v) {
  check_shape(v, value_.shape(), "KfacFactor::set_value");
  value_ = v;
  double tr = 0;
  for (int64_t i = 0; i < dim_; ++i) tr += diagonal() ? v[i] : v[i * dim_ + i];
  trace_ = tr;
}

// --- inversion ---

double KfacFactor::mean_diag(const FactorBlock& b) const {
  double s = 0;
  for (int64_t i = b.offset; i < b.offset + b.size; ++i) s += diagonal() ? value_[i] : value_[i * dim_ + i];
  return s / static_cast<double>(b.size);
}

// Inverts (block + damping I) into work_, then into inverse_ on success only. Row-major upper
// triangle = column-major lower triangle, so LAPACK runs column-major 'L' on the row-major upper
// data (no transposed copy inside LAPACKE).
bool KfacFactor::try_invert(const FactorBlock& b, double damping, int* info) {
  const int64_t n = b.size, off = b.offset;
  const float* v = value_.data();
  float* w = work_.data();
  float* inv = inverse_.data();
  const float lambda = static_cast<float>(damping);
  *info = 0;
  if (diagonal()) {
    for (int64_t i = 0; i < n; ++i) {
      float d = v[off + i] + lambda;
      if (!(d > 0.0f)) {
        *info = static_cast<int>(i + 1);
        return false;
      }
      w[i] = 1.0f / d;
      if (!std::isfinite(w[i])) {
        *info = static_cast<int>(i + 1);
        return false;
      }
    }
    std::memcpy(inv + off, w, n * sizeof(float));
    return true;
  }
  // The block, damped, in the first n rows of an m x m matrix; a padded row is the identity's.
  const int64_t m = inverse_order(n);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = r; c < n; ++c) w[r * m + c] = v[(off + r) * dim_ + off + c] + (r == c ? lambda : 0.0f);
    for (int64_t c = n; c < m; ++c) w[r * m + c] = 0.0f;
  }
  for (int64_t r = n; r < m; ++r)
    for (int64_t c = r; c < m; ++c) w[r * m + c] = r == c ? 1.0f : 0.0f;
  const auto lm = static_cast<lapack_int>(m);
  *info = LAPACKE_spotrf(LAPACK_COL_MAJOR, 'L', lm, w, lm);
  if (*info != 0) return false;
  *info = LAPACKE_spotri(LAPACK_COL_MAJOR, 'L', lm, w, lm);
  if (*info != 0) return false;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = r; c < n; ++c)
      if (!std::isfinite(w[r * m + c])) {
        *info = static_cast<int>(r + 1);
        return false;
      }
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = r; c < n; ++c) {
      inv[(off + r) * dim_ + off + c] = w[r * m + c];
      inv[(off + c) * dim_ + off + r] = w[r * m + c];
    }
  return true;
}

InvertResult KfacFactor::invert_block(int j, double damping) {
  PF_CHECK(j >= 0 && j < num_blocks(), "factor {}: block {} of {}", name_, j, num_blocks());
  PF_CHECK(damping >= 0, "factor {}: damping {}", name_, damping);
  // With ema 0 the step's sum accumulates in the factor itself: it is only whole after commit.
  PF_CHECK(own_accumulator() || pending_ == 0, "factor {}: inverted while {} micro-batches of curvature "
           "are pending (commit first)", name_, pending_);
  const FactorBlock& b = blocks_[j];
  const float* v = value_.data();
  bool finite = true;
  for (int64_t r = b.offset; r < b.offset + b.size && finite; ++r) {
    if (diagonal()) {
      finite = std::isfinite(v[r]);
    } else {
      for (int64_t c = r; c < b.offset + b.size; ++c) finite = finite && std::isfinite(v[r * dim_ + c]);
    }
  }
  if (!finite) {
    ++failures_;
    spdlog::warn("kfac {}: block {} holds NaN/Inf; keeping the previous inverse", name_, j);
    return {InvertStatus::NonFinite, 0, damping};
  }
  double lambda = damping;
  for (int attempt = 0;; ++attempt) {
    int info = 0;
    if (try_invert(b, lambda, &info)) {
      ++inversions_;
      return {attempt == 0 ? InvertStatus::Ok : InvertStatus::Raised, attempt, lambda};
    }
    if (attempt == max_retries_) {
      ++failures_;
      spdlog::error("kfac {}: block {} not positive definite even with damping {:g} (info {}); "
                    "keeping the previous inverse", name_, j, lambda, info);
      return {InvertStatus::Failed, attempt, lambda};
    }
    // x10, from a floor relative to the factor's scale when the damping is 0.
    double md = mean_diag(b);
    double raised = lambda > 0 ? 10.0 * lambda : 1e-6 * (md > 0 ? md : 1.0);
    spdlog::warn("kfac {}: block {} not positive definite with damping {:g} (info {}); retrying with {:g}",
                 name_, j, lambda, info, raised);
    ++retries_;
    lambda = raised;
  }
}

InvertResult KfacFactor::invert(double damping) {
  InvertResult worst;
  worst.damping = damping;
  for (int j = 0; j < num_blocks(); ++j) {
    InvertResult r = invert_block(j, damping);
    worst.retries += r.retries;
    worst.damping = std::max(worst.damping, r.damping);
    if (static_cast<int>(r.status) > static_cast<int>(worst.status)) worst.status = r.status;
  }
  return worst;
}

// --- checkpoints ---

void KfacFactor::save(const std::string& prefix, NamedTensors& out) const {
  out.emplace_back(prefix, value_);
  out.emplace_back(prefix + "_inv", inverse_);
  Tensor counters({4});
  const int64_t c[4] = {commits_, inversions_, retries_, failures_};
  for (int i = 0; i < 4; ++i) {
    PF_CHECK(c[i] < (int64_t{1} << 24), "factor {}: counter {} too large for a float", name_, c[i]);
    counters[i] = static_cast<float>(c[i]);
  }
  out.emplace_back(prefix + "_counters", std::move(counters));
}

void KfacFactor::load(const std::string& prefix, const NamedTensors& in) {
  auto find = [&](const std::string& name, const Shape& shape) -> const Tensor& {
    for (const auto& [n, t] : in)
      if (n == name) {
        if (t.shape() != shape)
          usage_error(name, "shape {} but this model expects {}", shape_str(t.shape()), shape_str(shape));
        return t;
      }
    usage_error(name, "missing from the K-FAC state");
  };
  set_value(find(prefix, value_.shape()));
  inverse_ = find(prefix + "_inv", inverse_.shape());
  const Tensor& c = find(prefix + "_counters", Shape{4});
  commits_ = static_cast<int64_t>(c[0]);
  inversions_ = static_cast<int64_t>(c[1]);
  retries_ = static_cast<int64_t>(c[2]);
  failures_ = static_cast<int64_t>(c[3]);
  pending_ = 0;
}

double time_one_inversion(int64_t d) {
  KfacFactor f("perf", d);
  Tensor v({d, d});
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < d; ++j) v[i * d + j] = i == j ? 2.0f : 1.0f / static_cast<float>(d + i + j);
  f.set_value(v);
  const auto t0 = std::chrono::steady_clock::now();
  f.invert(1e-3);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace pf
