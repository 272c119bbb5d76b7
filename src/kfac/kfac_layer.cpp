#include "kfac/kfac_layer.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pf {

namespace {
// Rows of the second product computed at a time: small enough to keep the raw gradient rows
// alive (for v.g) without a second weight-sized buffer, large enough for sgemm to run well.
constexpr int64_t kChunk = 64;
}  // namespace

CurvatureScale curvature_scale(int64_t tokens, double loss_scale) {
  PF_CHECK(tokens > 0 && loss_scale > 0, "curvature_scale(tokens {}, loss_scale {})", tokens, loss_scale);
  const double t = static_cast<double>(tokens);
  return {static_cast<float>(1.0 / t), static_cast<float>(1.0 / (t * loss_scale * loss_scale))};
}

double pi_damping(double trace_a, int64_t d_a, double trace_b, int64_t d_b) {
  const double ma = trace_a / static_cast<double>(d_a), mb = trace_b / static_cast<double>(d_b);
  if (!(ma > 0) || !(mb > 0) || !std::isfinite(ma) || !std::isfinite(mb)) return 1.0;
  return std::sqrt(ma / mb);
}

KfacLayer::KfacLayer(std::string name, int64_t d_in, int64_t d_out, const KfacLayerOptions& opt)
    : name_(std::move(name)), d_in_(d_in), d_out_(d_out),
      a_(name_ + ".A", d_in, FactorKind::Dense, opt.blocks_a, opt.ema_decay, opt.max_retries),
      b_(name_ + ".B", d_out, d_out > opt.diag_limit ? FactorKind::Diagonal : FactorKind::Dense,
         d_out > opt.diag_limit ? 1 : opt.blocks_b, opt.ema_decay, opt.max_retries),
      tmp_({d_out, d_in}), chunk_({std::min(kChunk, d_out), d_in}), bias_tmp_({d_out}) {}

void KfacLayer::update_curvature(const float* x, const float* g, int64_t rows, const CurvatureScale& s) {
  curvature_a(x, rows, s);
  curvature_b(g, rows, s);
}

double KfacLayer::damping(Side s, double gamma) const {
  PF_CHECK(gamma >= 0, "layer {}: damping gamma {}", name_, gamma);
  const double root = std::sqrt(gamma), p = pi();
  return s == Side::A ? root * p : root / p;
}

InvertResult KfacLayer::update_inverse(double gamma) {
  InvertResult ra = invert(Side::A, gamma);
  InvertResult rb = invert(Side::B, gamma);
  return static_cast<int>(rb.status) > static_cast<int>(ra.status) ? rb : ra;
}

double KfacLayer::curvature_cost(Side s, int64_t rows) const {
  const KfacFactor& f = factor(s);
  return curvature_flops(f.dim(), f.num_blocks(), rows, f.kind());
}

double KfacLayer::inversion_cost(Side s) const {
  const KfacFactor& f = factor(s);
  return inversion_flops(f.dim(), f.num_blocks(), f.kind());
}

double KfacLayer::inversion_cost_block(Side s, int block) const {
  const KfacFactor& f = factor(s);
  const double n = static_cast<double>(f.blocks().at(block).size);
  return f.diagonal() ? n : n * n * n;
}

void KfacLayer::precondition(Param& weight, Param* bias) {
  PF_CHECK(weight.grad.numel() == d_out_ * d_in_, "layer {}: weight grad {} for [{}, {}]", name_,
           shape_str(weight.grad.shape()), d_out_, d_in_);
  float* g = weight.grad.data();
  float* tmp = tmp_.data();
  const float* binv = b_.inverse().data();
  const float* ainv = a_.inverse().data();
  const auto din = static_cast<blasint>(d_in_), dout = static_cast<blasint>(d_out_);

  // tmp = B^-1 G: row scaling for a diagonal B, one product per diagonal block otherwise.
  if (b_.diagonal()) {
    for (int64_t o = 0; o < d_out_; ++o)
      for (int64_t i = 0; i < d_in_; ++i) tmp[o * d_in_ + i] = binv[o] * g[o * d_in_ + i];
  } else {
    for (const FactorBlock& blk : b_.blocks())
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(blk.size), din,
                  static_cast<blasint>(blk.size), 1.0f, binv + blk.offset * d_out_ + blk.offset, dout,
                  g + blk.offset * d_in_, din, 0.0f, tmp + blk.offset * d_in_, din);
  }

  // G = tmp A^-1, kChunk rows at a time, accumulating v.g before the raw rows are overwritten.
  double vg = 0;
  float* chunk = chunk_.data();
  for (int64_t r0 = 0; r0 < d_out_; r0 += kChunk) {
    const int64_t m = std::min(kChunk, d_out_ - r0);
    for (const FactorBlock& blk : a_.blocks())
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(m),
                  static_cast<blasint>(blk.size), static_cast<blasint>(blk.size), 1.0f,
                  tmp + r0 * d_in_ + blk.offset, din, ainv + blk.offset * d_in_ + blk.offset, din, 0.0f,
                  chunk + blk.offset, din);
    float* rows = g + r0 * d_in_;
    for (int64_t k = 0; k < m * d_in_; ++k) vg += static_cast<double>(chunk[k]) * rows[k];
    std::memcpy(rows, chunk, m * d_in_ * sizeof(float));
  }

  if (bias) {
    PF_CHECK(bias->grad.numel() == d_out_, "layer {}: bias grad {} for [{}]", name_,
             shape_str(bias->grad.shape()), d_out_);
    float* gb = bias->grad.data();
    float* vb = bias_tmp_.data();
    if (b_.diagonal()) {
      for (int64_t o = 0; o < d_out_; ++o) vb[o] = binv[o] * gb[o];
    } else {
      for (const FactorBlock& blk : b_.blocks())
        cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<blasint>(blk.size), static_cast<blasint>(blk.size),
                    1.0f, binv + blk.offset * d_out_ + blk.offset, dout, gb + blk.offset, 1, 0.0f,
                    vb + blk.offset, 1);
    }
    for (int64_t o = 0; o < d_out_; ++o) vg += static_cast<double>(vb[o]) * gb[o];
    std::memcpy(gb, vb, d_out_ * sizeof(float));
  }
  last_vg_ = vg;
}

NamedTensors KfacLayer::state() const {
  NamedTensors out;
  a_.save(name_ + ".kfac.A", out);
  b_.save(name_ + ".kfac.B", out);
  return out;
}

void KfacLayer::load_state(const NamedTensors& in) {
  a_.load(name_ + ".kfac.A", in);
  b_.load(name_ + ".kfac.B", in);
}

double kl_clip_scale(double vg_sum, double lr, double kappa) {
  const double denom = std::abs(vg_sum * lr * lr);
  if (!(denom > 0)) return 1.0;
  return std::min(1.0, std::sqrt(kappa / denom));
}

void scale_gradients(Param& weight, Param* bias, float nu) {
  for (float& v : weight.grad.span()) v *= nu;
  if (bias)
    for (float& v : bias->grad.span()) v *= nu;
}

double kl_clip(const KfacTarget* targets, size_t count, double lr, double kappa) {
  double vg = 0;
  for (size_t i = 0; i < count; ++i) vg += targets[i].layer->last_vg();
  const double nu = kl_clip_scale(vg, lr, kappa);
  if (nu < 1.0)
    for (size_t i = 0; i < count; ++i) scale_gradients(*targets[i].weight, targets[i].bias, static_cast<float>(nu));
  return nu;
}

}  // namespace pf
