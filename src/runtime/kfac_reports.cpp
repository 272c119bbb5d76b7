// What the executor's K-FAC side reports (runtime/README.md): the plan's lines, the profile and
// unit costs the plan was made from, the inline units for the profiler, the refresh record, the
// DistributedKfac's start line and dkfac.json.
#include "runtime/executor.hpp"

#include "comm/perf_model.hpp"
#include "comm/small.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "runtime/executor_parts.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

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
  std::set<std::string> seen;
  for (const std::string& s : all) {
    const json j = json::parse(s);
    for (const json& e : j[0])
      if (seen.insert("e" + e.dump()).second)
        r.events.push_back({e[0], e[1], e[2], e[3], {e[4].get<int64_t>(), e[5].get<int64_t>()}});
    for (const json& e : j[1])
      if (seen.insert("s" + e.dump()).second) r.splits.push_back({e[0], e[1], e[2], e[3]});
  }
  return r;
}

// The plan's period: the least common multiple of the devices' refresh cycles (0: no plan).
int plan_period(const KfacPlan* plan) {
  if (!plan) return 0;
  int p = 1;
  for (int r : plan->refresh_steps) p = std::lcm(p, std::max(r, 1));
  return p;
}

}  // namespace

void print_plan(const KfacPlan& p, const PlanInput& in, const std::string& from) {
  std::string r;
  for (int x : p.refresh_steps) r += fmt::format("{}{}", r.empty() ? "" : " ", x);
  std::printf("pipefisher: planned from %s: refresh every %s steps (per device), %zu split "
              "inversions, inline work %.3f ms per cycle, utilization %.0f%%, step %.2f ms (%.2f ms without K-FAC "
              "units in bubbles)\n",
              from.c_str(), r.c_str(), p.splits().size(), p.inline_time, 100 * p.utilization, p.step_time,
              p.base_step_time);
  if (p.weight_gradients.total > 0) std::printf("pipefisher: %s (ms)\n", p.weight_gradients.line().c_str());
  std::printf("pipefisher: %s (ms)\n", p.precondition_line().c_str());
  if (!p.placements().empty()) {  // several holders: SPD-KFAC's Algorithm 1 over each stage's holders
    int ct = 0, pieces = 0;
    for (const StagePlacement& sp : p.placements())  // Chimera's twins hold the same placement: count it once
      if (sp.pipeline == 0) ct += sp.placement.communicated(), pieces += static_cast<int>(sp.pieces.size());
    std::printf("pipefisher: inversion pieces: %d broadcast, %d inverted on every holder (broadcast model %.4g ms + "
                "%.4g ms/byte)\n", ct, pieces - ct, in.bcast_alpha, in.bcast_beta);
  }
  std::fflush(stdout);
}

const PlanProfile* Executor::plan_profile() const { return kfac_ && kfac_->plan ? &kfac_->plan_input : nullptr; }

void Executor::expand_inline_units(std::vector<Action>& actions, std::vector<ActionTime>& times) const {
  if (!kfac_) return;
  std::vector<Action> a2;
  std::vector<ActionTime> t2;
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    size_t c = chunks_.size();
    if (a.kind == Kind::PREC)
      for (size_t k = 0; k < chunks_.size(); ++k)
        if (chunks_[k]->stage == a.stage && chunks_[k]->pipeline == a.pipeline) c = k;
    ActionTime t = times[i];
    if (c < chunks_.size()) {
      for (const ChunkKfac::UnitStamp& u : kfac_->chunk[c]->inline_units()) {
        if (u.start < t.start || u.end > t.end) continue;  // an earlier step's refresh
        a2.push_back({u.kind, a.stage, a.pipeline, -1, u.layer});
        t2.push_back({u.start, u.end, 0});
        t.start = u.end;  // the PREC's own work follows its units
        t.wait = 0;       // a wait before the units shows as the idle time before the first
      }
    }
    a2.push_back(a);
    t2.push_back(t);
  }
  actions = std::move(a2);
  times = std::move(t2);
}

std::vector<std::tuple<int, int, int, std::string>> Executor::kfac_layer_names() const {
  std::vector<std::tuple<int, int, int, std::string>> out;
  if (!kfac_) return out;
  for (size_t c = 0; c < chunks_.size(); ++c)
    for (int l = 0; l < kfac_->chunk[c]->layers(); ++l) {
      // The layer's name: its weight's without ".weight" (bert.encoder.layer.0.attention.self.query).
      std::string name = kfac_->chunk[c]->pre().layer(l).name();
      if (name.ends_with(".weight")) name.resize(name.size() - 7);
      out.emplace_back(chunks_[c]->pipeline, chunks_[c]->stage, l, std::move(name));
    }
  return out;
}

std::string Executor::kfac_distributed_line() const {
  if (!kfac_ || kfac_->dist.empty()) return "";
  const DistributedKfac& d = *kfac_->dist.front();
  const KfacConfig& kc = cfg_.kfac;
  const std::string ablation = kc.distributed != KfacStrategy::SpdKfac || (kc.spd_pipelining && kc.spd_balance) ? ""
                               : kc.spd_pipelining ? ", no balance" : kc.spd_balance ? ", no pipelining"
                                                                                     : ", no pipelining, no balance";
  return fmt::format("K-FAC factors and inversions shared by {}{} among {} copies of each stage; stage {}: {} factors, "
                     "{} inverses broadcast, perf model {}", kc.distributed, ablation, kfac_->holders.front().size(),
                     chunks_.front()->stage, d.factors(), d.placement().communicated(),
                     kfac_->perf->from_cache ? "cached" : "measured");
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

void Executor::write_dkfac_record(const std::string& path, double step_time_sum, int timed_steps) {
  if (!kfac_ || kfac_->dist.empty()) return;
  KfacState& k = *kfac_;
  using nlohmann::json;
  // This rank: its stages' fusion and placement, and its time totals (per curvature / inversion step).
  json stages = json::array();
  double inflight = 0, wait = 0, messages = 0, inversion = 0, inverse_wait = 0;
  int steps = 0, inversion_steps = 0;
  for (size_t i = 0; i < chunks_.size(); ++i) {
    const DistributedKfac& d = *k.dist[i];
    const InversionPlacement& pl = d.placement();
    stages.push_back({{"pipeline", chunks_[i]->pipeline}, {"stage", chunks_[i]->stage}, {"factors", d.factors()},
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
      {"holders_per_stage", k.holders.front().size()},
      {"factors", sum.factors},
      {"fused_messages", {{"A", sum.fused_a}, {"B", sum.fused_b}}},
      // The whole model's factors, stage after stage (owner: the rank among the stage's holders).
      {"placement", {{"owner", sum.owner}, {"communicated", sum.communicated},
                     {"model_load_s", sum.load.size() == 1 ? sum.load[0] : sum.load}}},
      {"stages", sum.stages},
      {"perf_model", json::parse(comm::perf_model_to_json(*k.perf))},
      {"timed_steps", timed_steps},
  };
  out.update(sum.times);  // step_time_s, factor_inflight_s, factor_wait_s, factor_messages, inversion_s, inverse_wait_s
  const double inflight_s = sum.times.value("factor_inflight_s", 0.0), wait_s = sum.times.value("factor_wait_s", 0.0);
  out["factor_hidden_fraction"] = inflight_s > 0 ? 1.0 - wait_s / inflight_s : 0.0;
  write_file_atomic(path, out.dump(2) + "\n");
}

void Executor::write_kfac_record(const std::string& path) {
  if (!kfac_) return;
  std::vector<const ChunkKfac*> mine;
  for (auto& c : kfac_->chunk) mine.push_back(c.get());
  RefreshRecord r = gather_refresh_record(mine, groups_.rank);
  if (groups_.rank != 0) return;
  r.steps = step_ + 1;
  r.plan_start = kfac_->plan_start;
  r.period = plan_period(kfac_->plan.get());
  r.recorded_with = record_shape(cfg_);
  r.layout = record_layout(cfg_);
  write_refresh_record(std::move(r), path);
}

}  // namespace pf
