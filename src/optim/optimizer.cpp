#include "optim/optimizer.hpp"

#include "config/placement.hpp"
#include "optim/chunked.hpp"

#include <cmath>

namespace pf {

using namespace optim_detail;

void Optimizer::init(std::span<Param* const> params) {
  PF_CHECK(slots_.empty(), "{} optimizer initialised twice", name());
  slots_.reserve(params.size());
  for (Param* p : params) {
    PF_CHECK(p->grad.shape() == p->value.shape(), "'{}': grad {} vs value {}", p->name,
             shape_str(p->grad.shape()), shape_str(p->value.shape()));
    Slot s;
    s.param = p;
    for (StateSpec& spec : state_specs(*p)) {
      s.state.emplace_back(spec.shape);
      s.names.push_back(std::move(spec.name));
    }
    s.partial.assign(static_cast<size_t>(2 * num_chunks(p->value.numel())), 0.0);
    slots_.push_back(std::move(s));
  }
}

double Optimizer::grad_sq_norm(std::span<Param* const> params) {
  if (slots_.empty()) init(params);
  PF_CHECK(params.size() == slots_.size(), "step with {} params, initialised with {}", params.size(),
           slots_.size());
  double total = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    PF_CHECK(params[i] == slots_[i].param, "param {} ('{}') is not the one given to init()", i, params[i]->name);
    if (params[i]->mirror) continue;
    const float* g = params[i]->grad.data();
    total += chunked_sums<1>(params[i]->grad.numel(), slots_[i].partial, [g](int64_t b, int64_t e, auto& s) {
      Lanes acc;
      for_lanes(b, e, [&](int64_t j, int lane) { acc.v[lane] += static_cast<double>(g[j]) * g[j]; });
      s[0] = acc.total();
    })[0];
  }
  return total;
}

double Optimizer::clip_scale(double grad_norm) const {
  return grad_clip_ > 0 && grad_norm > grad_clip_ ? grad_clip_ / grad_norm : 1.0;
}

void Optimizer::step(std::span<Param* const> params, double lr) {
  step(params, lr, std::sqrt(grad_sq_norm(params)));
}

void Optimizer::step(std::span<Param* const> params, double lr, double grad_norm) {
  if (slots_.empty()) init(params);
  PF_CHECK(params.size() == slots_.size(), "step with {} params, initialised with {}", params.size(),
           slots_.size());
  for (size_t i = 0; i < params.size(); ++i)
    PF_CHECK(params[i] == slots_[i].param, "param {} ('{}') is not the one given to init()", i, params[i]->name);
  // A non-finite global norm means a NaN/Inf gradient somewhere: the update would write it into
  // every parameter. The step is skipped (state and step count unchanged); the loop reports it.
  if (!std::isfinite(grad_norm)) return;
  ++steps_;
  const float scale = static_cast<float>(clip_scale(grad_norm));
  for (Slot& s : slots_) update(s, lr, steps_, scale);
}

std::vector<Optimizer::StateSpec> Optimizer::state_specs(const Param& p) const {
  std::vector<StateSpec> out;
  for (std::string& n : state_names()) out.push_back({std::move(n), p.value.shape()});
  return out;
}

std::vector<std::pair<std::string, Tensor*>> Optimizer::state_tensors() {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (Slot& s : slots_)
    for (size_t k = 0; k < s.names.size(); ++k) out.emplace_back(s.param->name + "." + s.names[k], &s.state[k]);
  return out;
}

std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& c) {
  switch (c.name) {
    case OptimName::NvLamb: return std::make_unique<NvLamb>(c.beta1, c.beta2, c.eps, c.weight_decay, c.grad_clip);
    case OptimName::AdamW: return std::make_unique<AdamW>(c.beta1, c.beta2, c.eps, c.weight_decay, c.grad_clip);
    case OptimName::Sgd: return std::make_unique<Sgd>(c.momentum, c.weight_decay, c.grad_clip);
    case OptimName::Soap: return std::make_unique<Soap>(c);
  }
  usage_error("optim.name", "unknown optimizer '{}' (expected nvlamb, adamw, sgd or soap)", c.name);
}

std::unique_ptr<Optimizer> make_optimizer(const Config& cfg) {
  std::unique_ptr<Optimizer> o = make_optimizer(cfg.optim);
  if (auto* soap = dynamic_cast<Soap*>(o.get()); soap && places_soap_work(cfg))
    soap->statistics_at_refreshes_only(placement_spec(cfg.kfac).statistics_at_refreshes_only);
  return o;
}

}  // namespace pf
