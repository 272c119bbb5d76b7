#include "runtime/plan_record.hpp"

#include "config/placement.hpp"
#include "core/error.hpp"
#include "core/files.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

namespace pf {

namespace {
// Per stage: [holders, layers, PREC, then per field Lmax layer slots: CURV_A, CURV_B, INV_A,
// INV_B, d_in, d_out, diagonal B, then sync].
constexpr size_t kHolders = 0, kLayers = 1, kPrecondition = 2, kFirstLayerField = 3, kLayerFields = 7;
size_t layer_slot(size_t Lmax, size_t field, size_t layer) { return kFirstLayerField + field * Lmax + layer; }
size_t sync_slot(size_t Lmax) { return kFirstLayerField + kLayerFields * Lmax; }
}  // namespace

bool planner_measures(Kind k) { return is_pass(k) || k == Kind::OPT; }

ProfileLayout::ProfileLayout(const Layout& layout)
    : off(layout.devices + 1, 0),
      ranks(layout.devices * layout.replicas),
      broadcast(layout.replicas > 1 || layout.pipelines() > 1) {
  for (int d = 0; d < layout.devices; ++d) off[d + 1] = off[d] + layout.schedule.per_device[d].size();
  // 6 per transformer block; the BERT head's transform, pooler and NSP classifier.
  for (const BlockRange& r : layout.stage_blocks) Lmax = std::max(Lmax, 6 * (r.last - r.first + 1) + 3);
  per_stage = sync_slot(Lmax) + 1;
  size = off[layout.devices] + layout.stages() * per_stage + 2;
}

// A stage's passes of one kind do the same work, micro-batch after micro-batch, yet the first
// forward of each profiled step ran up to 4x longer than the others and than in the planned
// steps (bench/RESULTS.md, "Where PipeFisher's step goes"), which told the planner of a bubble
// that is not there. Each pass gets its kind's median on this device.
void passes_at_their_median(const std::vector<Action>& lowered, std::vector<double>& ms) {
  std::map<std::tuple<Kind, int, int>, std::vector<double>> kinds;
  const auto key = [&](size_t i) { return std::tuple{lowered[i].kind, lowered[i].stage, lowered[i].pipeline}; };
  for (size_t i = 0; i < lowered.size(); ++i)
    if (is_pass(lowered[i].kind)) kinds[key(i)].push_back(ms[i]);
  for (auto& [k, v] : kinds) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    v.front() = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  }
  for (size_t i = 0; i < lowered.size(); ++i)
    if (is_pass(lowered[i].kind)) ms[i] = kinds[key(i)].front();
}

std::vector<double> ProfileLayout::zeros() const { return std::vector<double>(size, 0.0); }

void ProfileLayout::set_actions(std::vector<double>& wire, int device, const std::vector<double>& ms) const {
  PF_CHECK(ms.size() == off[device + 1] - off[device], "device {}: {} action times, its list has {}", device, ms.size(),
           off[device + 1] - off[device]);
  std::copy(ms.begin(), ms.end(), wire.begin() + off[device]);
}

void ProfileLayout::add_stage(std::vector<double>& wire, int stage, const StageKfacCost& holder) const {
  PF_CHECK(holder.layers() <= Lmax, "stage {}: {} K-FAC layers, the profile has {} slots", stage, holder.layers(), Lmax);
  double* e = &wire.at(off.back() + stage * per_stage);
  e[kHolders] += 1;
  e[kLayers] += holder.layers();
  e[kPrecondition] += holder.precondition;
  for (int l = 0; l < holder.layers(); ++l) {
    const bool diagonal = !holder.diag_b.empty() && holder.diag_b[l] != 0;
    const double fields[kLayerFields] = {holder.curv_a[l], holder.curv_b[l], holder.inv_a[l], holder.inv_b[l],
                                         static_cast<double>(holder.dim_a[l]), static_cast<double>(holder.dim_b[l]),
                                         diagonal ? 1.0 : 0.0};
    for (size_t f = 0; f < kLayerFields; ++f) e[layer_slot(Lmax, f, l)] += fields[f];
  }
  e[sync_slot(Lmax)] += holder.sync;
}

void ProfileLayout::add_broadcast(std::vector<double>& wire, double alpha, double beta) const {
  wire[size - 2] += alpha;
  wire[size - 1] += beta;
}

PlanProfile ProfileLayout::mean(const std::vector<double>& v) const {
  PF_CHECK(v.size() == size, "K-FAC profile of {} values, expected {}", v.size(), size);
  PlanProfile p;
  for (size_t d = 0; d + 1 < off.size(); ++d) p.action_ms.emplace_back(v.begin() + off[d], v.begin() + off[d + 1]);
  for (size_t st = 0; st < (size - 2 - off.back()) / per_stage; ++st) {
    const double* e = &v[off.back() + st * per_stage];
    const double n = std::max(1.0, e[kHolders]);
    StageKfacCost c;
    c.precondition = e[kPrecondition] / n;
    c.sync = e[sync_slot(Lmax)] / n;
    const int layers = std::min(Lmax, static_cast<int>(e[kLayers] / n + 0.5));
    for (int l = 0; l < layers; ++l) {
      auto field = [&](size_t f) { return e[layer_slot(Lmax, f, l)] / n; };
      c.curv_a.push_back(field(0));
      c.curv_b.push_back(field(1));
      c.inv_a.push_back(field(2));
      c.inv_b.push_back(field(3));
      c.dim_a.push_back(static_cast<int>(field(4) + 0.5));
      c.dim_b.push_back(static_cast<int>(field(5) + 0.5));
      c.diag_b.push_back(field(6) > 0.5 ? 1 : 0);
    }
    p.kfac.push_back(std::move(c));
  }
  if (broadcast) p.bcast_alpha = v[size - 2] / ranks, p.bcast_beta = v[size - 1] / ranks;
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

nlohmann::json profile_run(const Config& cfg, const Layout& layout) {
  const int S = layout.stages(), D = layout.devices;
  return {{"schedule", layout.schedule.name}, {"devices", D}, {"virtual_stages", S / D},
          {"micro_batches", layout.micro_batches}, {"replicas", layout.replicas}, {"model", cfg.model.preset},
          {"kfac", cfg.kfac.enabled ? name_of(cfg.kfac.placement) : std::string("off")},
          {"recompute", cfg.parallel.recompute && S > 1}};  // as the executor: pipelines only
}

namespace {

// Each stage's forward, backward (or its two halves) and optimizer: the mean of its actions'
// times in `p`.
nlohmann::json stage_times(const Layout& layout, const PlanProfile& p) {
  struct Mean {
    double sum = 0;
    int n = 0;
    double get() const { return n > 0 ? sum / n : 0; }
  };
  std::vector<std::map<Kind, Mean>> by(layout.stages());
  for (int d = 0; d < layout.devices; ++d)
    for (size_t i = 0; i < p.action_ms.at(d).size(); ++i) {
      const Action& a = layout.schedule.per_device[d].at(i);
      if (!planner_measures(a.kind)) continue;
      Mean& m = by[a.stage][a.kind];
      m.sum += p.action_ms[d][i];
      ++m.n;
    }
  nlohmann::json stages = nlohmann::json::array();
  for (std::map<Kind, Mean>& m : by) {
    const bool split = m.count(Kind::I) > 0;
    nlohmann::json s = {{"forward", m[Kind::F].get()},
                        {"backward", split ? m[Kind::I].get() + m[Kind::W].get() : m[Kind::B].get()},
                        {"optimizer", m[Kind::OPT].get()}};
    if (split) s["input_grad"] = m[Kind::I].get(), s["weight_grad"] = m[Kind::W].get();
    stages.push_back(std::move(s));
  }
  return stages;
}

}  // namespace

PlanRecordRun plan_record_run(const Config& cfg, const Layout& layout) {
  return {plan_shape(cfg, layout), profile_run(cfg, layout), cfg.parallel.micro_batch_size};
}

nlohmann::json plan_profile_json(const PlanRecordRun& run, const Layout& layout, const PlanProfile& p) {
  nlohmann::json j = {{"format", "pipefisher-profile"},
                      {"version", 1},
                      {"micro_batch_size", run.micro_batch_size},
                      {"stages", stage_times(layout, p)},
                      {"run", run.run}};
  add_plan_profile(j, p);
  return j;
}

nlohmann::json plan_profile_json(const Config& cfg, const Layout& layout, const PlanProfile& p) {
  return plan_profile_json(plan_record_run(cfg, layout), layout, p);
}

PlanProfile read_plan_profile(const Config& cfg, const Layout& layout) {
  const std::string& path = cfg.kfac.plan_profile;
  const std::string key = "kfac.plan_profile";
  const nlohmann::json j = nlohmann::json::parse(read_input_file(path, key, size_t{256} << 20), nullptr, false);
  if (j.is_discarded()) usage_error(key, "'{}' is not JSON", path);
  if (!j.is_object() || !j.contains("pipefisher_plan") || !j["pipefisher_plan"].is_object())
    usage_error(key, "'{}' holds no \"pipefisher_plan\" object (written by a kfac.placement = bubbles run)", path);
  const nlohmann::json& rec = j["pipefisher_plan"];
  const nlohmann::json want = plan_shape(cfg, layout);
  if (!rec.contains("shape") || rec["shape"] != want)
    usage_error(key, "'{}' was recorded for {}, this run is {}", path, rec.value("shape", nlohmann::json()).dump(),
                want.dump());
  PlanProfile p = read_profile(j, fmt::format("{} ({})", key, path)).plan;
  const bool soap_units = !p.kfac.empty() && p.kfac[0].curv_a.empty();
  if (!p.kfac.empty() && soap_units != places_soap_work(cfg))
    usage_error(key, "'{}' holds {}'s units, and this run plans {}'s: record it with this run's optimizer", path,
                soap_units ? "SOAP" : "K-FAC", soap_units ? "K-FAC" : "SOAP");
  if (p.action_ms.empty())
    usage_error(key, "'{}' holds an earlier build's record (\"pipefisher_plan\" without \"action_ms\"): record it again", path);
  const ProfileLayout wire(layout);
  bool fits = p.action_ms.size() == static_cast<size_t>(layout.devices) &&
              p.kfac.size() == static_cast<size_t>(layout.stages());
  for (size_t d = 0; fits && d < p.action_ms.size(); ++d) fits = p.action_ms[d].size() == wire.off[d + 1] - wire.off[d];
  for (const StageKfacCost& c : p.kfac) fits = fits && c.layers() <= wire.Lmax;
  if (!fits)
    usage_error(key, "'{}': its action times or K-FAC units do not fit this run's layout ({} devices, {} stages)", path,
                layout.devices, layout.stages());
  return p;
}

}  // namespace pf
