// What K-FAC's units report (kfac_units.hpp): the layers' names, an inline refresh's units for
// the profiler, the DistributedKfac's start line and dkfac.json, the refresh record.
#include "runtime/units/kfac_units.hpp"

#include "comm/small.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "runtime/plan_record.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

namespace pf {

namespace {

// Every rank's refresh changes, gathered on rank 0 (Chimera's twins and data-parallel replicas
// record the same changes: kept once). Collective; the others get an empty record.
RefreshRecord gather_refresh_record(const std::vector<const ChunkKfac*>& mine, int rank) {
  using nlohmann::json;
  json ev = json::array(), sp = json::array();
  for (const ChunkKfac* c : mine) {
    for (const RefreshEvent& e : c->events())
      ev.push_back({e.layer, e.side, e.block, e.use_step, e.id.curv_step, e.id.pi_step});
    for (const SplitEvent& s : c->splits()) sp.push_back({s.layer, s.side, s.blocks, s.from_step});
  }
  const std::vector<std::string> all = comm::gather_bytes(json{ev, sp}.dump(), 0, MPI_COMM_WORLD);
  RefreshRecord r;
  if (rank != 0) return r;
  std::set<std::pair<char, std::string>> seen;  // ('e' event | 's' split, its JSON)
  for (const std::string& s : all) {
    const json j = json::parse(s);
    for (const json& e : j[0])
      if (seen.emplace('e', e.dump()).second)
        r.events.push_back({e[0], e[1], e[2], e[3], {e[4].get<int64_t>(), e[5].get<int64_t>()}});
    for (const json& e : j[1])
      if (seen.emplace('s', e.dump()).second) r.splits.push_back({e[0], e[1], e[2], e[3]});
  }
  return r;
}

}  // namespace

void KfacUnits::expand_inline_units(std::vector<Action>& actions, std::vector<ActionTime>& times) const {
  std::vector<Action> a2;
  std::vector<ActionTime> t2;
  std::vector<int64_t> moved(actions.size());  // [old index] new index, for in_wait_of
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    ActionTime t = times[i];
    if (a.kind == Kind::PREC) {
      for (const ChunkKfac::UnitStamp& u : service(a.pipeline, a.stage).chunk().inline_units()) {
        if (u.start < t.start || u.end > t.end) continue;  // an earlier step's refresh
        a2.push_back({u.kind, a.stage, a.pipeline, -1, u.layer});
        t2.push_back({u.start, u.end, 0});
        t.start = u.end;  // the PREC's own work follows its units
        t.wait = 0;       // a wait before the units shows as the idle time before the first
      }
    }
    moved[i] = static_cast<int64_t>(a2.size());
    a2.push_back(a);
    t2.push_back(t);
  }
  for (ActionTime& t : t2)
    if (t.in_wait_of >= 0) t.in_wait_of = moved.at(static_cast<size_t>(t.in_wait_of));
  actions = std::move(a2);
  times = std::move(t2);
}

std::vector<std::tuple<int, int, int, std::string>> KfacUnits::layer_names() const {
  std::vector<std::tuple<int, int, int, std::string>> out;
  for (const HostedChunk& c : chunks_)
    for (int l = 0; l < c.kfac->chunk().layers(); ++l) {
      // The layer's name: its weight's without ".weight" (bert.encoder.layer.0.attention.self.query).
      std::string name = c.kfac->chunk().pre().layer(l).name();
      if (name.ends_with(".weight")) name.resize(name.size() - 7);
      out.emplace_back(c.pipeline, c.stage, l, std::move(name));
    }
  return out;
}

std::string KfacUnits::distributed_line() const {
  if (chunks_.empty() || !chunks_[0].kfac->distributed()) return "";
  const HostedChunk& first = chunks_[0];
  const DistributedKfac& d = *first.kfac->distributed();
  const KfacConfig& kc = cfg_.kfac;
  const std::string ablation = kc.distributed != KfacStrategy::SpdKfac || (kc.spd_pipelining && kc.spd_balance) ? ""
                               : kc.spd_pipelining ? ", no balance" : kc.spd_balance ? ", no pipelining"
                                                                                     : ", no pipelining, no balance";
  return fmt::format("K-FAC factors and inversions shared by {}{} among {} copies of each stage; stage {}: {} factors, "
                     "{} inverses broadcast, perf model {}", kc.distributed, ablation, first.kfac->holders_size(),
                     first.stage, d.factors(), d.placement().communicated(),
                     perf_->from_cache ? "cached" : "measured");
}

namespace {
// What dkfac.json says of the whole run, from every rank's record (write_dkfac_record): replica
// 0's pipeline-0 stages in stage order with their factors and placements concatenated, and the
// time totals averaged over the ranks.
struct DkfacSummary {
  nlohmann::json stages = nlohmann::json::array(), owner = nlohmann::json::array(), load = nlohmann::json::array();
  int factors = 0, communicated = 0, fused_a = 0, fused_b = 0;
  nlohmann::json times = nlohmann::json::object();  // each rank's "times", key by key
};

DkfacSummary summarize_dkfac(const std::vector<std::string>& ranks, int stages) {
  using nlohmann::json;
  DkfacSummary sum;
  std::vector<json> per_stage(static_cast<size_t>(stages));
  for (const std::string& r : ranks) {
    const json j = json::parse(r);
    for (const auto& [key, v] : j["times"].items())
      sum.times[key] = sum.times.value(key, 0.0) + v.get<double>() / static_cast<double>(ranks.size());
    if (j["replica"] != 0) continue;
    for (const json& st : j["stages"])
      if (st["pipeline"] == 0) per_stage.at(st["stage"].get<size_t>()) = st;
  }
  for (const json& st : per_stage) {
    for (const json& o : st["placement"]["owner"]) sum.owner.push_back(o);
    sum.load.push_back(st["placement"]["model_load_s"]);
    sum.factors += st["factors"].get<int>(), sum.communicated += st["placement"]["communicated"].get<int>();
    sum.fused_a += st["fused_messages"]["A"].get<int>(), sum.fused_b += st["fused_messages"]["B"].get<int>();
    sum.stages.push_back(st);
  }
  return sum;
}
}  // namespace

void KfacUnits::write_dkfac_record(const std::string& path, double step_time_sum, int timed_steps) {
  if (distributed_line().empty()) return;
  using nlohmann::json;
  // This rank: its stages' fusion and placement, and its time totals (per curvature / inversion step).
  json stages = json::array();
  double inflight = 0, wait = 0, messages = 0, inversion = 0, inverse_wait = 0;
  int steps = 0, inversion_steps = 0;
  for (const HostedChunk& c : chunks_) {
    const DistributedKfac& d = *c.kfac->distributed();
    const InversionPlacement& pl = d.placement();
    stages.push_back({{"pipeline", c.pipeline}, {"stage", c.stage}, {"factors", d.factors()},
                      {"fused_messages", {{"A", d.groups(Side::A).size()}, {"B", d.groups(Side::B).size()}}},
                      {"placement", {{"owner", pl.owner}, {"communicated", pl.communicated()}, {"model_load_s", pl.load}}}});
    const DkfacTimes& t = d.times();
    inflight += t.factor_inflight, wait += t.factor_wait, messages += t.factor_messages;
    inversion += t.inversion, inverse_wait += t.inverse_wait;
    steps = std::max(steps, t.steps), inversion_steps = std::max(inversion_steps, t.inversion_steps);
  }
  const double ks = std::max(1, steps), is = std::max(1, inversion_steps);
  const json mine = {{"replica", groups_.replica}, {"stages", stages},
                     {"times", {{"factor_inflight_s", inflight / ks}, {"factor_wait_s", wait / ks},
                                {"factor_messages", messages / ks}, {"inversion_s", inversion / is},
                                {"inverse_wait_s", inverse_wait / is},
                                {"step_time_s", timed_steps > 0 ? step_time_sum / timed_steps : 0.0}}}};
  const std::vector<std::string> all = comm::gather_bytes(mine.dump(), 0, MPI_COMM_WORLD);
  if (groups_.rank != 0) return;
  const DkfacSummary sum = summarize_dkfac(all, layout_.stages());
  const KfacConfig& kc = cfg_.kfac;
  json out = {
      {"strategy", kc.distributed},
      {"pipelining", kc.distributed == KfacStrategy::SpdKfac && kc.spd_pipelining},
      {"balance", kc.distributed == KfacStrategy::SpdKfac && kc.spd_balance},
      {"ranks", all.size()},
      {"holders_per_stage", chunks_[0].kfac->holders_size()},
      {"factors", sum.factors},
      {"fused_messages", {{"A", sum.fused_a}, {"B", sum.fused_b}}},
      // The whole model's factors, stage after stage (owner: the rank among the stage's holders).
      {"placement", {{"owner", sum.owner}, {"communicated", sum.communicated},
                     {"model_load_s", sum.load.size() == 1 ? sum.load[0] : sum.load}}},
      {"stages", sum.stages},
      {"perf_model", json::parse(comm::perf_model_to_json(*perf_))},
      {"timed_steps", timed_steps},
  };
  out.update(sum.times);  // step_time_s, factor_inflight_s, factor_wait_s, factor_messages, inversion_s, inverse_wait_s
  const double inflight_s = sum.times.value("factor_inflight_s", 0.0), wait_s = sum.times.value("factor_wait_s", 0.0);
  out["factor_hidden_fraction"] = inflight_s > 0 ? 1.0 - wait_s / inflight_s : 0.0;
  write_file_atomic(path, out.dump(2) + "\n");
}

void KfacUnits::write_refresh_record(const std::string& path, int64_t steps, int64_t plan_start, int period) {
  std::vector<const ChunkKfac*> mine;
  for (const HostedChunk& c : chunks_) mine.push_back(&c.kfac->chunk());
  RefreshRecord r = gather_refresh_record(mine, groups_.rank);
  if (groups_.rank != 0) return;
  r.steps = steps;
  r.plan_start = plan_start;
  r.period = period;
  r.recorded_with = record_shape(cfg_);
  r.layout = record_layout(cfg_);
  pf::write_refresh_record(std::move(r), path);
}

}  // namespace pf
