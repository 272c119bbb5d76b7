// SOAP (optimizer.hpp): Adam in the eigenbasis of Shampoo's statistics, for each Linear's weight.
#include "core/blas.hpp"
#include "optim/chunked.hpp"
#include "optim/moments.hpp"
#include "optim/optimizer.hpp"

#include <lapacke.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <tuple>

namespace pf {

namespace optim_detail {

// Buffers of a step, grown on the first step (which visits every weight) to the largest weight's
// needs, then reused: later steps, refreshes included, allocate nothing.
struct SoapScratch {
  std::vector<float> gp, out, mid;  // [m, n]: the rotated gradient, a rotation's result, its middle product
  std::vector<float> sq_a, sq_b;    // [d, d]: L Q (or the eigensolver's copy), the QR's matrix
  std::vector<float> eig, tau, work;
  std::vector<double> est;  // [d]: the estimated eigenvalues of a power iteration
  std::vector<lapack_int> iwork;
  std::vector<int> order;
  int64_t dim = 0;  // the largest side the square buffers fit

  static void grow(std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  }
  // Room for a side of d: ssyevd's workspace as computed from d (platform.md: its workspace query
  // is not to be trusted), geqrf's and orgqr's as they report it.
  void fit_side(int64_t d) {
    if (d <= dim) return;
    dim = d;
    grow(sq_a, d * d), grow(sq_b, d * d), grow(eig, d), grow(tau, d);
    order.resize(static_cast<size_t>(d));
    est.resize(static_cast<size_t>(d));
    const auto n = static_cast<lapack_int>(d);
    float q1 = 0, q2 = 0;
    LAPACKE_sgeqrf_work(LAPACK_COL_MAJOR, n, n, sq_b.data(), n, tau.data(), &q1, -1);
    LAPACKE_sorgqr_work(LAPACK_COL_MAJOR, n, n, n, sq_b.data(), n, tau.data(), &q2, -1);
    grow(work, std::max<int64_t>({1 + 6 * d + 2 * d * d, static_cast<int64_t>(q1), static_cast<int64_t>(q2)}));
    if (static_cast<int64_t>(iwork.size()) < 3 + 5 * d) iwork.resize(static_cast<size_t>(3 + 5 * d));
  }
};

}  // namespace optim_detail

using namespace optim_detail;

namespace {

// One weight's SOAP state: its moments (in the rotated basis) and per side its statistic and
// basis (nullptr: the side is longer than max_precond_dim and is not rotated).
struct SoapTensors {
  float* w;
  const float* g;
  float* m;
  float* v;
  float *L, *QL, *R, *QR;
  int64_t rows, cols;
};

SoapTensors soap_tensors(Param& p, std::vector<Tensor>& st, int max_dim) {
  SoapTensors x{p.value.data(), p.grad.data(), st[0].data(), st[1].data(), nullptr, nullptr, nullptr, nullptr,
                p.value.dim(0), p.value.dim(1)};
  size_t k = 2;
  if (x.rows <= max_dim) x.L = st[k].data(), x.QL = st[k + 1].data(), k += 2;
  if (x.cols <= max_dim) x.R = st[k].data(), x.QR = st[k + 1].data();
  return x;
}

void fit(SoapScratch& s, const SoapTensors& x) {
  const int64_t n = x.rows * x.cols;
  SoapScratch::grow(s.gp, n), SoapScratch::grow(s.out, n);
  if (x.QL && x.QR) SoapScratch::grow(s.mid, n);
  if (x.L) s.fit_side(x.rows);
  if (x.R) s.fit_side(x.cols);
}

// out = op(Q_L) (alpha x) op(Q_R): into the basis (Q_L^T x Q_R) or back out of it (Q_L x Q_R^T).
// `mid` holds the middle product when both sides rotate; out is not x.
void rotate(const SoapTensors& t, const float* x, float alpha, bool back, float* mid, float* out) {
  const int64_t r = t.rows, c = t.cols;
  if (t.QL && t.QR) {
    gemm(!back, false, r, c, r, alpha, t.QL, r, x, c, 0.0f, mid, c);
    gemm(false, back, r, c, c, 1.0f, mid, c, t.QR, c, 0.0f, out, c);
  } else if (t.QL) {
    gemm(!back, false, r, c, r, alpha, t.QL, r, x, c, 0.0f, out, c);
  } else if (t.QR) {
    gemm(false, back, r, c, c, alpha, x, c, t.QR, c, 0.0f, out, c);
  } else {
    for (int64_t i = 0; i < r * c; ++i) out[i] = alpha * x[i];
  }
}

// L = b L + (1 - b) (s G)(s G)^T and R = b R + (1 - b) (s G)^T (s G) for gradient g, s the
// clipping factor; side 0 L only, 1 R only, -1 both.
void accumulate_statistics(const SoapTensors& t, const float* g, float b, float c, float grad_scale, int side = -1) {
  const float alpha = c * grad_scale * grad_scale;
  if (t.L && side != 1) gemm(false, true, t.rows, t.rows, t.cols, alpha, g, t.cols, g, t.cols, b, t.L, t.rows);
  if (t.R && side != 0) gemm(true, false, t.cols, t.cols, t.rows, alpha, g, t.cols, g, t.cols, b, t.R, t.cols);
}

// The eigenvectors of the symmetric S [d, d] as the columns of Q, by decreasing eigenvalue
// (ssyevd returns them increasing). A failed solve leaves Q the identity (Adam on that side) and
// returns false.
bool eigenbasis(const float* S, int64_t d, float* Q, SoapScratch& s) {
  std::memcpy(s.sq_a.data(), S, static_cast<size_t>(d * d) * sizeof(float));
  const auto n = static_cast<lapack_int>(d);
  // A row-major symmetric matrix is its column-major self; the eigenvectors come back as columns.
  const lapack_int info =
      LAPACKE_ssyevd_work(LAPACK_COL_MAJOR, 'V', 'U', n, s.sq_a.data(), n, s.eig.data(), s.work.data(),
                          static_cast<lapack_int>(s.work.size()), s.iwork.data(), static_cast<lapack_int>(s.iwork.size()));
  const float* a = s.sq_a.data();
  for (int64_t i = 0; i < d; ++i)
    for (int64_t k = 0; k < d; ++k) Q[i * d + k] = info == 0 ? a[(d - 1 - k) * d + i] : (i == k ? 1.0f : 0.0f);
  return info == 0;
}

// One power iteration with QR (soap.py's get_orthogonal_matrix_QR) of the basis Q of S [d, d]:
// the columns sorted by decreasing estimated eigenvalue q_j^T S q_j, then Q = qr(S Q). Leaves the
// sort in s.order, for the second moment.
void power_step(const float* S, int64_t d, float* Q, SoapScratch& s) {
  float* T = s.sq_a.data();
  float* P = s.sq_b.data();
  gemm(false, false, d, d, d, 1.0f, S, d, Q, d, 0.0f, T, d);
  double* est = s.est.data();
  for (int64_t j = 0; j < d; ++j) est[j] = 0;
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < d; ++j) est[j] += static_cast<double>(Q[i * d + j]) * T[i * d + j];
  std::vector<int>& order = s.order;
  std::iota(order.begin(), order.begin() + d, 0);
  std::sort(order.begin(), order.begin() + d, [est](int a, int b) { return est[a] > est[b] || (est[a] == est[b] && a < b); });
  // (S Q)[:, order] column-major for LAPACK: S Q_sorted, whose QR is the new basis.
  for (int64_t j = 0; j < d; ++j)
    for (int64_t i = 0; i < d; ++i) P[j * d + i] = T[i * d + order[j]];
  const auto n = static_cast<lapack_int>(d), lw = static_cast<lapack_int>(s.work.size());
  LAPACKE_sgeqrf_work(LAPACK_COL_MAJOR, n, n, P, n, s.tau.data(), s.work.data(), lw);
  LAPACKE_sorgqr_work(LAPACK_COL_MAJOR, n, n, n, P, n, s.tau.data(), s.work.data(), lw);
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < d; ++j) Q[i * d + j] = P[j * d + i];
}

// v's rows (side 0) or columns (side 1) in s.order: v stays aligned with the sorted basis.
void permute_second_moment(const SoapTensors& x, int side, SoapScratch& s) {
  const int64_t r = x.rows, c = x.cols;
  float* tmp = s.gp.data();
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) tmp[i * c + j] = side == 0 ? x.v[s.order[i] * c + j] : x.v[i * c + s.order[j]];
  std::memcpy(x.v, tmp, static_cast<size_t>(r * c) * sizeof(float));
}

// New bases by one power iteration each; m rotated back with the old ones and into the new.
void refresh_bases(const SoapTensors& x, SoapScratch& s) {
  if (!x.QL && !x.QR) return;
  rotate(x, x.m, 1.0f, true, s.mid.data(), s.out.data());
  if (x.QL) power_step(x.L, x.rows, x.QL, s), permute_second_moment(x, 0, s);
  if (x.QR) power_step(x.R, x.cols, x.QR, s), permute_second_moment(x, 1, s);
  rotate(x, s.out.data(), 1.0f, false, s.mid.data(), x.m);
}

// One side's refresh: m's side rotated out of the old basis (Q_L m, or m Q_R^T), the basis moved
// by one power iteration with v's rows or columns permuted alike, m's side into the new basis
// (Q_L^T m, or m Q_R). The other side's basis stays: m = Q_L' (Q_L'^T Q_L m Q_R^T Q_R) Q_R^T holds.
void refresh_side(const SoapTensors& x, int side, SoapScratch& s) {
  float* Q = side == 0 ? x.QL : x.QR;
  if (!Q) return;
  const int64_t r = x.rows, c = x.cols;
  float* out = s.out.data();
  if (side == 0) gemm(false, false, r, c, r, 1.0f, Q, r, x.m, c, 0.0f, out, c);
  else gemm(false, true, r, c, c, 1.0f, x.m, c, Q, c, 0.0f, out, c);
  power_step(side == 0 ? x.L : x.R, side == 0 ? r : c, Q, s);
  permute_second_moment(x, side, s);
  if (side == 0) gemm(true, false, r, c, r, 1.0f, Q, r, out, c, 0.0f, x.m, c);
  else gemm(false, false, r, c, c, 1.0f, out, c, Q, c, 0.0f, x.m, c);
}

// Adam's moments of the rotated gradient gp over [b, e); gp becomes m / (sqrt(v) + eps).
void rotated_adam_range(int64_t b, int64_t e, float* __restrict gp, float* __restrict m, float* __restrict v,
                        Betas k, float eps) {
  for (int64_t i = b; i < e; ++i) {
    const float g = gp[i];
    m[i] = k.b1 * m[i] + k.c1 * g;
    v[i] = k.b2 * v[i] + k.c2 * g * g;
    gp[i] = m[i] / (std::sqrt(v[i]) + eps);
  }
}

// p = (p - step * n) * shrink over [b, e): the step, then the decoupled decay (soap.py's order).
void apply_range(int64_t b, int64_t e, float* __restrict w, const float* __restrict n, float step, float shrink) {
  for (int64_t i = b; i < e; ++i) w[i] = (w[i] - step * n[i]) * shrink;
}

// SOAP rotates a Linear's own weight matrix; everything else is AdamW's.
bool rotated(const Param& p) { return p.linear && p.value.rank() == 2; }

}  // namespace

Soap::Soap(const OptimConfig& c)
    : AdamW(c.beta1, c.beta2, c.eps, c.weight_decay, c.grad_clip),
      shampoo_beta_(c.soap.shampoo_beta),
      precondition_frequency_(c.soap.precondition_frequency),
      max_precond_dim_(c.soap.max_precond_dim),
      scratch_(std::make_unique<SoapScratch>()) {}

Soap::~Soap() = default;

std::vector<Optimizer::StateSpec> Soap::state_specs(const Param& p) const {
  if (!rotated(p)) return AdamW::state_specs(p);
  const int64_t m = p.value.dim(0), n = p.value.dim(1);
  std::vector<StateSpec> out{{"exp_avg", {m, n}}, {"exp_avg_sq", {m, n}}};
  if (m <= max_precond_dim_) out.push_back({"L", {m, m}}), out.push_back({"Q_L", {m, m}});
  if (n <= max_precond_dim_) out.push_back({"R", {n, n}}), out.push_back({"Q_R", {n, n}});
  return out;
}

void Soap::update(Slot& slot, double lr, int64_t t, float grad_scale) {
  if (rotated(*slot.param)) return update_matrix(slot, lr, t, grad_scale);
  AdamW::update(slot, lr, t, grad_scale);
}

void Soap::update_matrix(Slot& slot, double lr, int64_t t, float grad_scale) {
  const SoapTensors x = soap_tensors(*slot.param, slot.state, max_precond_dim_);
  SoapScratch& s = *scratch_;
  fit(s, x);
  const float bs = static_cast<float>(shampoo_beta_), cs = static_cast<float>(1.0 - shampoo_beta_);
  const int64_t k = t - 1;  // SOAP's own count: its first step only sets up the bases
  if (k == 0) {
    accumulate_statistics(x, x.g, bs, cs, grad_scale);
    for (auto [S, d, Q, side] : {std::tuple{x.L, x.rows, x.QL, "L"}, std::tuple{x.R, x.cols, x.QR, "R"}})
      if (S && !eigenbasis(S, d, Q, s))
        spdlog::warn("soap: the eigensolver failed on {}'s {} statistic; that side keeps the identity basis", slot.param->name, side);
    return;
  }
  const int64_t n = x.rows * x.cols;
  rotate(x, x.g, grad_scale, false, s.mid.data(), s.gp.data());
  const Betas betas = moment_betas(beta1_, beta2_);
  const float eps = static_cast<float>(eps_);
  float* gp = s.gp.data();
  for_chunks(n, [&](int64_t b, int64_t e) { rotated_adam_range(b, e, gp, x.m, x.v, betas, eps); });
  rotate(x, gp, 1.0f, true, s.mid.data(), s.out.data());
  const double kd = static_cast<double>(k);
  const float step = static_cast<float>(lr * std::sqrt(1.0 - std::pow(beta2_, kd)) / (1.0 - std::pow(beta1_, kd)));
  const float shrink = slot.param->decay ? static_cast<float>(1.0 - lr * weight_decay_) : 1.0f;
  const float* dir = s.out.data();
  for_chunks(n, [&](int64_t b, int64_t e) { apply_range(b, e, x.w, dir, step, shrink); });
  const auto i = static_cast<size_t>(&slot - slots().data());
  if (refresh_steps_only_ && k % precondition_frequency_ != 0) return;
  if (defer_) hold_gradient(i, grad_scale);
  else accumulate_statistics(x, x.g, bs, cs, grad_scale);
  if (!by_units_ && k % precondition_frequency_ == 0) add_pending(i, -1), refresh_bases(x, s);
}

// The update's gradient kept for STAT; what the previous update kept, if still pending, added first.
void Soap::hold_gradient(size_t slot, float grad_scale) {
  add_pending(slot, -1);
  if (pending_.size() < slots().size()) pending_.resize(slots().size());
  Pending& p = pending_[slot];
  const Param& param = *slots()[slot].param;
  p.grad.assign(param.grad.data(), param.grad.data() + param.grad.numel());
  p.scale = grad_scale;
  p.side[0] = p.side[1] = true;
}

void Soap::add_pending(size_t slot, int side) {
  if (slot >= pending_.size()) return;
  Pending& p = pending_[slot];
  if (!p.side[0] && !p.side[1]) return;  // nothing held (or not a rotated weight)
  const SoapTensors x = soap_tensors(*slots()[slot].param, slots()[slot].state, max_precond_dim_);
  const float bs = static_cast<float>(shampoo_beta_), cs = static_cast<float>(1.0 - shampoo_beta_);
  for (int s : {0, 1})
    if (p.side[s] && (side < 0 || side == s)) accumulate_statistics(x, p.grad.data(), bs, cs, p.scale, s), p.side[s] = false;
}

void Soap::settle() {
  for (size_t i = 0; i < pending_.size(); ++i) add_pending(i, -1);
}

// Planning only (its copies allocate; no step does).
double Soap::time_statistics(int weight) {
  Slot& slot = rotated_slot(weight);
  const SoapTensors x = soap_tensors(*slot.param, slot.state, max_precond_dim_);
  std::vector<float> L, R;
  if (x.L) L.assign(x.L, x.L + x.rows * x.rows);
  if (x.R) R.assign(x.R, x.R + x.cols * x.cols);
  const float bs = static_cast<float>(shampoo_beta_), cs = static_cast<float>(1.0 - shampoo_beta_);
  const auto t0 = std::chrono::steady_clock::now();
  accumulate_statistics(x, x.g, bs, cs, 1.0f);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (x.L) std::memcpy(x.L, L.data(), L.size() * sizeof(float));
  if (x.R) std::memcpy(x.R, R.data(), R.size() * sizeof(float));
  return ms;
}

std::vector<int> Soap::rotated_weights(std::span<Param* const> params) {
  std::vector<int> out;
  for (size_t i = 0; i < params.size(); ++i)
    if (rotated(*params[i])) out.push_back(static_cast<int>(i));
  return out;
}

size_t Soap::rotated_index(int weight) {
  int n = 0;
  for (size_t i = 0; i < slots().size(); ++i)
    if (rotated(*slots()[i].param) && n++ == weight) return i;
  PF_CHECK(false, "soap: no rotated weight {} (it has {})", weight, n);
  return 0;
}

bool Soap::has_factor(int weight, int side) {
  const Slot& slot = rotated_slot(weight);
  return slot.param->value.dim(side) <= max_precond_dim_;
}

void Soap::refresh_factor(int weight, int side) {
  const size_t i = rotated_index(weight);
  if (step_count() == 0) return;  // no basis yet: the first step's eigensolver makes it
  add_pending(i, side);  // the statistic the refresh reads, as inline SOAP's
  Slot& slot = slots()[i];
  const SoapTensors x = soap_tensors(*slot.param, slot.state, max_precond_dim_);
  fit(*scratch_, x);
  refresh_side(x, side, *scratch_);
}

// Planning only (its copies allocate; no step does).
double Soap::time_refresh_factor(int weight, int side) {
  PF_CHECK(!defer_, "soap: a refresh timed while statistics are deferred (its copies would drop them)");
  Slot& slot = rotated_slot(weight);
  std::vector<Tensor> kept = slot.state;
  const auto t0 = std::chrono::steady_clock::now();
  refresh_factor(weight, side);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  for (size_t k = 0; k < kept.size(); ++k)  // in place: state_tensors() hands out these tensors
    std::memcpy(slot.state[k].data(), kept[k].data(), static_cast<size_t>(kept[k].numel()) * sizeof(float));
  return ms;
}

}  // namespace pf
