#include "runtime/plan_record.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

namespace pf {

StageProfile StageProfile::mean() const {
  const double n = std::max(1.0, holders);
  StageProfile m;
  m.holders = 1;
  m.layers = layers / n;
  m.precondition = precondition / n;
  m.sync = sync / n;
  for (const LayerProfile& l : layer)
    m.layer.push_back({l.curv_a / n, l.curv_b / n, l.inv_a / n, l.inv_b / n, l.d_in / n, l.d_out / n, l.diagonal_b / n});
  return m;
}

int StageProfile::layer_count() const { return static_cast<int>(layers / std::max(1.0, holders) + 0.5); }

ProfileLayout::ProfileLayout(const Layout& layout) : off(layout.devices + 1, 0) {
  for (int d = 0; d < layout.devices; ++d) off[d + 1] = off[d] + layout.schedule.per_device[d].size();
  // 6 per transformer block; the BERT head's transform, pooler and NSP classifier.
  for (const BlockRange& r : layout.stage_blocks) Lmax = std::max(Lmax, 6 * (r.last - r.first + 1) + 3);
  per_stage = 4 + 7 * static_cast<size_t>(Lmax);
  size = off[layout.devices] + layout.stages() * per_stage + 2;
}

PlanProfile ProfileLayout::empty() const {
  PlanProfile p;
  for (size_t d = 0; d + 1 < off.size(); ++d) p.action_ms.emplace_back(off[d + 1] - off[d], 0.0);
  const size_t stages = (size - 2 - off.back()) / per_stage;
  p.stages.assign(stages, StageProfile{});
  for (StageProfile& s : p.stages) s.layer.assign(Lmax, LayerProfile{});
  return p;
}

// Per stage: [holders, layers, PREC, CURV_A x Lmax, CURV_B x Lmax, INV_A x Lmax, INV_B x Lmax,
// d_in x Lmax, d_out x Lmax, diagonal B x Lmax, sync].
namespace {
template <class Stage, class Value>
void for_each_slot(Stage& s, size_t Lmax, double* e, Value&& v) {
  v(e[0], s.holders);
  v(e[1], s.layers);
  v(e[2], s.precondition);
  for (size_t l = 0; l < Lmax; ++l) {
    auto& x = s.layer[l];
    v(e[3 + l], x.curv_a), v(e[3 + Lmax + l], x.curv_b), v(e[3 + 2 * Lmax + l], x.inv_a);
    v(e[3 + 3 * Lmax + l], x.inv_b), v(e[3 + 4 * Lmax + l], x.d_in), v(e[3 + 5 * Lmax + l], x.d_out);
    v(e[3 + 6 * Lmax + l], x.diagonal_b);
  }
  v(e[3 + 7 * Lmax], s.sync);
}
}  // namespace

std::vector<double> ProfileLayout::flatten(const PlanProfile& p) const {
  std::vector<double> v(size, 0.0);
  for (size_t d = 0; d < p.action_ms.size(); ++d) std::copy(p.action_ms[d].begin(), p.action_ms[d].end(), v.begin() + off[d]);
  for (size_t st = 0; st < p.stages.size(); ++st)
    for_each_slot(p.stages[st], Lmax, &v[off.back() + st * per_stage], [](double& slot, double x) { slot = x; });
  v[size - 2] = p.bcast_alpha;
  v[size - 1] = p.bcast_beta;
  return v;
}

PlanProfile ProfileLayout::unflatten(const std::vector<double>& v) const {
  PF_CHECK(v.size() == size, "K-FAC profile of {} values, expected {}", v.size(), size);
  PlanProfile p = empty();
  for (size_t d = 0; d < p.action_ms.size(); ++d)
    std::copy(v.begin() + off[d], v.begin() + off[d + 1], p.action_ms[d].begin());
  std::vector<double> w = v;  // for_each_slot takes a mutable slot
  for (size_t st = 0; st < p.stages.size(); ++st)
    for_each_slot(p.stages[st], Lmax, &w[off.back() + st * per_stage], [](double& slot, double& x) { x = slot; });
  p.bcast_alpha = v[size - 2];
  p.bcast_beta = v[size - 1];
  return p;
}

nlohmann::json plan_shape(const Config& cfg, const Layout& layout) {
  nlohmann::json stages = nlohmann::json::array();
  for (const BlockRange& r : layout.stage_blocks) stages.push_back({r.first, r.last});
  const ModelConfig& m = cfg.model;
  return {{"schedule", layout.schedule.name},
          {"devices", layout.devices},
          {"replicas", layout.replicas},
          {"micro_batches", layout.micro_batches},
          {"stage_blocks", stages},
          {"arch", m.arch},
          {"layers", m.layers},
          {"hidden", m.hidden},
          {"ffn", m.ffn},
          {"vocab", m.vocab},
          {"seq_len", m.seq_len},
          {"micro_batch_size", cfg.parallel.micro_batch_size},
          {"kfac_diag_limit", cfg.kfac.diag_limit},
          {"nsp", cfg.data.nsp}};
}

nlohmann::json plan_record(const Config& cfg, const Layout& layout, const std::vector<double>& input) {
  return {{"shape", plan_shape(cfg, layout)}, {"input", input}};
}

std::vector<double> read_plan_profile(const Config& cfg, const Layout& layout, size_t size) {
  const std::string& path = cfg.kfac.plan_profile;
  const std::string key = "kfac.plan_profile";
  std::ifstream f(path, std::ios::binary);
  if (!f) usage_error(key, "cannot open '{}'", path);
  std::stringstream text;
  text << f.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded()) usage_error(key, "'{}' is not JSON", path);
  if (!j.is_object() || !j.contains("pipefisher_plan") || !j["pipefisher_plan"].is_object())
    usage_error(key, "'{}' holds no \"pipefisher_plan\" object (written by a kfac.placement = bubbles run)", path);
  const nlohmann::json& rec = j["pipefisher_plan"];
  const nlohmann::json want = plan_shape(cfg, layout);
  if (!rec.contains("shape") || rec["shape"] != want)
    usage_error(key, "'{}' was recorded for {}, this run is {}", path, rec.value("shape", nlohmann::json()).dump(),
                want.dump());
  if (!rec.contains("input") || !rec["input"].is_array() || rec["input"].size() != size)
    usage_error(key, "'{}': \"input\" must be an array of {} numbers", path, size);
  std::vector<double> v;
  for (const nlohmann::json& x : rec["input"]) {
    if (!x.is_number() || !std::isfinite(x.get<double>()) || x.get<double>() < 0)
      usage_error(key, "'{}': \"input\" holds {}, expected finite non-negative numbers", path, x.dump());
    v.push_back(x.get<double>());
  }
  return v;
}

}  // namespace pf
