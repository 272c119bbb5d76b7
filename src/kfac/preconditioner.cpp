#include "kfac/preconditioner.hpp"

#include "core/error.hpp"
#include "core/kernels.hpp"

#include <spdlog/spdlog.h>

namespace pf {

KfacPreconditioner::KfacPreconditioner(const std::vector<Linear*>& linears, const KfacConfig& cfg, int64_t vocab)
    : cfg_(cfg) {
  KfacLayerOptions opt;
  opt.ema_decay = cfg.ema;
  opt.diag_limit = cfg.diag_limit;
  layers_.reserve(linears.size());
  for (Linear* l : linears) {
    if (l->out() == vocab) {  // the decoder: vocab^2 B, tied weight
      skipped_.push_back(l->name());
      continue;
    }
    index_[l] = layers_.size();
    Entry e;
    e.linear = l;
    e.kfac = std::make_unique<KfacLayer>(l->name(), l->in(), l->out(), opt);
    layers_.push_back(std::move(e));
  }
  for (Entry& e : layers_) targets_.push_back({e.kfac.get(), &e.linear->weight(), e.linear->bias()});
}

KfacPreconditioner::~KfacPreconditioner() { detach(); }

int KfacPreconditioner::index_of(const Linear& l) const {
  auto it = index_.find(&l);
  return it == index_.end() ? -1 : static_cast<int>(it->second);
}

void KfacPreconditioner::attach() {
  for (Entry& e : layers_) e.linear->set_tap(this);
  attached_ = true;
}

void KfacPreconditioner::attach(size_t i) {
  layers_.at(i).linear->set_tap(this);
  attached_ = true;
}

void KfacPreconditioner::detach() {
  if (!attached_) return;
  for (Entry& e : layers_)
    if (e.linear->tap() == this) e.linear->set_tap(nullptr);
  attached_ = false;
}

void KfacPreconditioner::on_input(const Linear& l, int, const float* x, int64_t rows, int64_t cols) {
  const int i = index_of(l);
  PF_CHECK(i >= 0 && cols == l.in(), "kfac tap on '{}' ({} columns)", l.name(), cols);
  curvature(static_cast<size_t>(i), Side::A, x, rows);
}

void KfacPreconditioner::on_grad_output(const Linear& l, int, const float* g, int64_t rows, int64_t cols) {
  const int i = index_of(l);
  PF_CHECK(i >= 0 && cols == l.out(), "kfac tap on '{}' ({} columns)", l.name(), cols);
  curvature(static_cast<size_t>(i), Side::B, g, rows);
}

void KfacPreconditioner::curvature(size_t i, Side s, const float* x, int64_t rows) {
  Entry& e = layers_.at(i);
  if (s == Side::A)
    e.kfac->curvature_a(x, rows, {1.0f, 1.0f});
  else
    e.kfac->curvature_b(x, rows, {1.0f, 1.0f});
  e.rows[side_index(s)] += rows;
}

bool KfacPreconditioner::finish_curvature(size_t i, Side s, double loss_scale, int64_t total_rows) {
  Entry& e = layers_.at(i);
  int64_t& counted = e.rows[side_index(s)];
  const int64_t t = total_rows >= 0 ? total_rows : counted;
  KfacFactor& f = e.kfac->factor(s);
  counted = 0;
  if (f.pending_micro_batches() == 0) return false;
  if (t > 0 && e.linear->row_mean_loss()) loss_scale = 1.0 / static_cast<double>(t);  // linear.hpp
  if (t > 0 && loss_scale > 0) {  // else the sum is empty (or all zero gradients): nothing to scale
    const CurvatureScale cs = curvature_scale(t, loss_scale);
    const float k = s == Side::A ? cs.a : cs.b;
    for (float& v : f.accumulator().span()) v *= k;
  }
  return f.commit();
}

InvertResult KfacPreconditioner::invert(size_t i, Side s) { return layers_.at(i).kfac->invert(s, cfg_.damping); }

void KfacPreconditioner::precondition(size_t i) {
  Entry& e = layers_.at(i);
  e.kfac->precondition(e.linear->weight(), e.linear->bias());
}

int KfacPreconditioner::finish_curvature(double loss_scale) {
  int n = 0;
  for (size_t i = 0; i < layers_.size(); ++i)
    for (Side s : {Side::A, Side::B}) n += finish_curvature(i, s, loss_scale);
  return n;
}

InversionSummary KfacPreconditioner::invert_all() {
  InversionSummary sum;
  for (size_t i = 0; i < layers_.size(); ++i)
    for (Side s : {Side::A, Side::B}) {
      const InvertResult r = invert(i, s);
      ++sum.factors;
      sum.retries += r.retries;
      if (r.status == InvertStatus::Raised) ++sum.raised;
      if (!r.ok()) ++sum.kept;
    }
  if (sum.raised + sum.kept > 0)
    spdlog::warn("kfac: {} of {} factors not positive definite with damping {:g}: {} inverted with raised "
                 "damping, {} kept their previous inverse",
                 sum.raised + sum.kept, sum.factors, cfg_.damping, sum.raised, sum.kept);
  return sum;
}

void KfacPreconditioner::precondition_all() {
  for (size_t i = 0; i < layers_.size(); ++i) precondition(i);
}

double KfacPreconditioner::vg_sum() const {
  double vg = 0;
  for (const KfacTarget& t : targets_) vg += t.layer->last_vg();
  return vg;
}

double KfacPreconditioner::grad_sq_sum() const {
  double sq = 0;
  for (const KfacTarget& t : targets_) {
    sq += sum_squares(t.weight->grad.data(), t.weight->grad.numel());
    if (t.bias) sq += sum_squares(t.bias->grad.data(), t.bias->grad.numel());
  }
  return sq;
}

void KfacPreconditioner::scale_gradients(double nu) {
  for (const KfacTarget& t : targets_) pf::scale_gradients(*t.weight, t.bias, static_cast<float>(nu));
}

double KfacPreconditioner::kl_clip(double lr) {
  if (cfg_.kl_clip <= 0) return 1.0;
  return pf::kl_clip(targets_.data(), targets_.size(), lr, cfg_.kl_clip);
}

NamedTensors KfacPreconditioner::state() const {
  NamedTensors out;
  for (const Entry& e : layers_) {
    NamedTensors s = e.kfac->state();
    for (auto& kv : s) out.push_back(std::move(kv));
  }
  return out;
}

void KfacPreconditioner::load_state(const NamedTensors& in) {
  for (Entry& e : layers_) e.kfac->load_state(in);
}

}  // namespace pf
