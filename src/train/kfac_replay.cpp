#include "train/kfac_replay.hpp"

#include "core/error.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace pf {

namespace {

constexpr const char* kKey = "kfac.refresh_record";


std::string kept_name(const std::string& layer, int side, int64_t step) {
  return fmt::format("{}.kfac.{}@{}", layer, side == 0 ? "A" : "B", step);
}

// The record read and checked against cfg before the pattern is built from it.
RefreshRecord checked_record(const Config& cfg) {
  RefreshRecord r = read_refresh_record(cfg.kfac.refresh_record, kKey);
  check_record_fits(r, cfg, kKey);
  return r;
}

}  // namespace

KfacReplay::KfacReplay(const Config& cfg, KfacPreconditioner& kfac)
    : kfac_(kfac),
      damping_(cfg.kfac.damping),
      record_(checked_record(cfg)),
      pattern_(record_, cfg.train.steps, kKey) {
  for (size_t i = 0; i < kfac_.size(); ++i) index_[kfac_.layer(i).name()] = i;
  std::map<std::string, int> changes;  // per K-FAC layer, over the record
  for (const RefreshEvent& e : record_.events) {
    if (!index_.count(e.layer))
      usage_error(kKey, "'{}' names the layer '{}', which this model has no K-FAC layer of", record_.path, e.layer);
    ++changes[e.layer];
  }
  for (const auto& [name, i] : index_)
    if (!changes.count(name)) usage_error(kKey, "'{}' never refreshes the K-FAC layer '{}' of this model", record_.path, name);
}

size_t KfacReplay::layer_index(const std::string& name) const { return index_.at(name); }

void KfacReplay::apply_splits(int64_t t) {
  for (const SplitEvent& s : pattern_.splits_at(t))
    kfac_.layer(layer_index(s.layer)).factor(side_at(s.side)).set_blocks(s.blocks);
}

bool KfacReplay::begin_step(int64_t t) {
  apply_splits(t);
  bool any = false;
  for (const auto& [name, i] : index_)
    if (pattern_.builds(name, t)) kfac_.attach(i), any = true;
  return any;
}

void KfacReplay::abandon_step() {
  kfac_.detach();
  kfac_.finish_curvature(1.0);  // the partial sums go nowhere: every inversion sets its factor from kept_
}

void KfacReplay::apply_change(const RefreshEvent& e) {
  const size_t i = layer_index(e.layer);
  KfacLayer& layer = kfac_.layer(i);
  for (int side : {0, 1}) {
    const int64_t from = side == e.side ? e.id.curv_step : e.id.pi_step;
    KfacFactor& f = layer.factor(side_at(side));
    if (from < 0) {
      f.set_value(Tensor(f.value().shape()));  // none committed yet: pi = 1
      continue;
    }
    auto it = kept_.find({i, side, from});
    if (it == kept_.end()) {  // its step was not finite (train.on_nonfinite = skip): the old inverse stays
      spdlog::warn("kfac replay: step {}'s factor {} of '{}' was never committed: its inverse is kept", from,
                   side == 0 ? "A" : "B", e.layer);
      return;
    }
    f.set_value(it->second);
  }
  if (e.block < 0)
    layer.invert(side_at(e.side), damping_);
  else
    layer.invert_block(side_at(e.side), e.block, damping_);
}

int KfacReplay::end_step(int64_t t, double loss_scale) {
  kfac_.detach();
  for (const auto& [name, i] : index_) {
    if (!pattern_.builds(name, t)) continue;
    for (int side : {0, 1}) {
      kfac_.finish_curvature(i, side_at(side), loss_scale);
      kept_[{i, side, t}] = kfac_.layer(i).factor(side_at(side)).value();
    }
  }
  const std::vector<RefreshEvent>& changes = pattern_.events_at(t);
  for (const RefreshEvent& e : changes) apply_change(e);
  std::erase_if(kept_, [&](const auto& kv) { return std::get<2>(kv.first) <= t - pattern_.max_lag(); });
  return static_cast<int>(changes.size());
}

NamedTensors KfacReplay::state() const {
  NamedTensors out;
  for (const auto& [key, value] : kept_) {
    const auto& [i, side, step] = key;
    out.emplace_back(kept_name(kfac_.layer(i).name(), side, step), value);
  }
  return out;
}

void KfacReplay::prepare_resume(int64_t t) {
  for (int64_t s = 0; s < t && s < pattern_.steps(); ++s) apply_splits(s);
  kept_.clear();
  for (int64_t x = std::max<int64_t>(0, t - pattern_.max_lag()); x < t && x < pattern_.steps(); ++x)
    for (const auto& [name, i] : index_)
      if (pattern_.builds(name, x))
        for (int side : {0, 1}) kept_[{i, side, x}] = Tensor(kfac_.layer(i).factor(side_at(side)).value().shape());
}

void KfacReplay::load_state(const NamedTensors& in) {
  PF_CHECK(in.size() == kept_.size(), "{} kept factors loaded for {}", in.size(), kept_.size());
  size_t n = 0;
  for (auto& [key, value] : kept_) value = in[n++].second;
}

std::string KfacReplay::describe() const {
  auto layout = [&](const char* k) {
    auto it = record_.layout.find(k);
    return it == record_.layout.end() ? std::string("?") : it->second;
  };
  return fmt::format("kfac: replaying '{}' ({} stages, {}: {} recorded steps, plan from step {}, period {} steps{})",
                     record_.path, layout("parallel.stages"), layout("parallel.schedule"), record_.steps, record_.plan_start,
                     record_.period, pattern_.steps() > record_.steps ? ", repeated past its end" : "");
}

}  // namespace pf
