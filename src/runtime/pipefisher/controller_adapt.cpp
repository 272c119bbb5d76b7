// PipeFisher's controller, adapting (controller.hpp; kfac.placement = adaptive): the planned steps'
// own timings, summed since the last look; at a cycle start of every device the planner plans
// again from them, and a plan with other refresh cycles that the run can switch to is switched to.
// The refresh record (kfac/refresh_record.hpp) keeps whatever pattern results, so a single process
// still follows the run exactly.
#include "runtime/pipefisher/controller.hpp"

#include "comm/small.hpp"
#include "core/error.hpp"
#include "runtime/plan_record.hpp"

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <string>

namespace pf {

namespace {

double ms_of(const ActionTime& t) { return static_cast<double>(t.end - t.start - t.wait) / 1e6; }

// The units the steady state measures: curvature per micro-batch and whole inversions by layer,
// the precondition and the curvature sync per chunk. (A diagonal block's time is not the whole
// factor's: a split factor keeps the plan's cost.)
bool measured_unit(const Action& a) {
  switch (a.kind) {
    case Kind::CURV_A: case Kind::CURV_B: case Kind::PREC: case Kind::SYNC_CURV: return true;
    case Kind::INV_A: case Kind::INV_B: return a.block < 0;
    default: return false;
  }
}

// The splits as (pipeline, stage, layer, kind, blocks), and each stage's inversion owners.
auto split_keys(const KfacPlan& p) {
  std::vector<std::tuple<int, int, int, Kind, int>> k;
  for (const FactorSplit& f : p.splits()) k.emplace_back(f.pipeline, f.stage, f.layer, f.kind, f.blocks);
  std::sort(k.begin(), k.end());
  return k;
}
bool same_owners(const KfacPlan& a, const KfacPlan& b) {
  if (a.placements().size() != b.placements().size()) return false;
  for (size_t i = 0; i < a.placements().size(); ++i) {
    const StagePlacement &x = a.placements()[i], &y = b.placements()[i];
    if (x.pieces != y.pieces || x.placement.owner != y.placement.owner) return false;
  }
  return true;
}
size_t inline_units(const KfacPlan& p) {
  return std::count_if(p.units().begin(), p.units().end(), [](const PlacedUnit& u) { return u.inline_work; });
}

}  // namespace

void Controller::restart_steady(int64_t since) {
  steady_ = {since, std::vector<Mean>(lowered_.size())};
  for (ChunkMeasures& c : chunks_) c.steady.clear();
}

// A planned step's stamps added to the steady state: each lowered action the planner times (by
// its place in the device's lowered list: zero-bubble W may run elsewhere in a planned list) and
// each measured unit of a hosted chunk.
void Controller::measure_steady(const std::vector<Action>& list, const std::vector<ActionTime>& times) {
  if (times.size() != list.size()) return;
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    if (measured_unit(a)) {
      // A rank's list holds only its own chunks' units.
      const int c = static_cast<int>(units_.hosted().index_of(a.pipeline, a.stage));
      const bool per_layer = a.kind != Kind::PREC && a.kind != Kind::SYNC_CURV;
      Mean& m = chunks_.at(c).steady[{static_cast<int>(a.kind), per_layer ? a.layer : -1}];
      m.sum += ms_of(times[i]), ++m.n;
    } else if (planner_measures(a.kind)) {
      const auto at = std::find(lowered_.begin(), lowered_.end(), a);
      if (at == lowered_.end()) continue;
      Mean& m = steady_.actions[at - lowered_.begin()];
      m.sum += ms_of(times[i]), ++m.n;
    }
  }
}

// Due at the end of a planned `step` (the plan's step 0 at plan_start) when the next step (one the
// run has) starts a cycle of every device, kAdaptSteps or more after the steady state began, and
// the plan can change its cycles there: no Chimera sync is pinned to a cycle step (its inversions
// wrap past the cycle's first step). Asked only when the run adapts (no recorded profile fixes
// the plan: PipeFisherOptions::adapts) and no drain was just decided.
bool Controller::adapt_due(int64_t step, int64_t plan_start) const {
  const int64_t next = step + 1 - plan_start;
  return plan_->sync_step < 0 && step + 1 < opts_.steps &&
         step + 1 - steady_.since >= kAdaptSteps && plan_->all_cycles_start(next) == next;
}

// Collective: every rank plans from the same all-reduced measurements, so every rank decides the same.
std::optional<std::vector<Action>> Controller::adapt(int64_t step) {
  PlanProfile measured = measured_profile(steady_times(), plan_input_.shape, "the measured K-FAC steps");
  const double scale = seams_.adapt_cost_scale.value_or(seams_.cost_scale);
  std::unique_ptr<KfacPlan> next = plan_for(measured, scale);
  const int64_t since = steady_.since;
  restart_steady(step + 1);
  if (next->refresh_steps == plan_->refresh_steps) return std::nullopt;  // nothing to change
  const std::string why_not = not_adaptable(*next);
  if (why_not.empty()) return switch_plan(std::move(next), std::move(measured), scale, since, step + 1);
  if (groups_.rank == 0) {
    std::printf("pipefisher: re-planned from steps %lld-%lld as run (adaptive): refresh every %s steps, not taken: %s\n",
                static_cast<long long>(since) + 1, static_cast<long long>(step) + 1,
                fmt::format("{}", fmt::join(next->refresh_steps, " ")).c_str(), why_not.c_str());
    std::fflush(stdout);
  }
  return std::nullopt;
}

// What the steady state measured in place of the profiled times; a time not measured (a split
// factor's inversion, a split precondition, a unit another holder runs) stays the plan's.
Controller::RankTimes Controller::steady_times() const {
  const int W = layout_.replicas;
  RankTimes mine;
  mine.actions.assign(lowered_.size(), 0.0);
  for (size_t i = 0; i < lowered_.size(); ++i) {
    const Mean& m = steady_.actions[i];
    if (planner_measures(lowered_[i].kind)) mine.actions[i] = (m.n > 0 ? m.sum / m.n : plan_input_.action_ms[device_][i]) / W;
  }
  for (size_t c = 0; c < units_.hosted().size(); ++c) {
    const HostedChunk& h = units_.hosted()[c];
    StageKfacCost cost = plan_input_.kfac.size() == 1 ? plan_input_.kfac[0] : plan_input_.kfac.at(h.stage);
    const PrecSplit* split = plan_->prec_split(h.pipeline, h.stage);
    for (const auto& [key, m] : chunks_[c].steady) {
      const auto [kind, layer] = key;
      const Kind k = static_cast<Kind>(kind);
      if (m.n == 0 || !is_kfac(k) || is_bcast_inv(k)) continue;
      if (k == Kind::PREC && split && split->split()) continue;
      cost.unit(k, layer) = m.sum / m.n;
    }
    mine.chunks.push_back(std::move(cost));
  }
  mine.bcast = {plan_input_.bcast_alpha, plan_input_.bcast_beta};
  return mine;
}

// Why the run does not switch to a plan with other refresh cycles ("": it does): it switches when
// no cycle is longer than kfac.max_refresh_steps (0: the profile's plan's, so a quiet run never
// refreshes less often than `bubbles`), the factor splits and inversion owners stay (the factors
// and the previous cycle's broadcasts carry over), and no inline work is added (adapting never
// adds to the critical path). kfac.min_refresh_steps bounds the cycles from below in the planner.
std::string Controller::not_adaptable(const KfacPlan& next) const {
  const KfacPlan& now = *plan_;
  if (next.sync_step >= 0) return "a Chimera sync pinned to a cycle step";
  for (size_t d = 0; d < next.refresh_steps.size(); ++d) {
    const int bound = opts_.max_refresh_steps > 0 ? opts_.max_refresh_steps : profiled_refresh_.at(d);
    if (next.refresh_steps[d] > bound)
      return opts_.max_refresh_steps > 0
                 ? fmt::format("device {} over kfac.max_refresh_steps = {}", d, bound)
                 : fmt::format("device {} over the profile's plan's {} steps (kfac.max_refresh_steps = 0)", d, bound);
  }
  if (split_keys(next) != split_keys(now)) return "other factor splits";
  if (!same_owners(next, now)) return "other inversion owners";
  if (inline_units(next) > inline_units(now)) return "more inline work";
  return "";
}

// Checkpoints: the steady state, the profiled plan's cycles (the switch: the phase's, save_state).
void Controller::save_adapt(nlohmann::json& j) const {
  nlohmann::json actions = nlohmann::json::array(), units = nlohmann::json::array();
  for (const Mean& m : steady_.actions) actions.push_back({m.sum, m.n});
  for (size_t c = 0; c < chunks_.size(); ++c)  // in (chunk, kind, layer) order, as earlier builds wrote
    for (const auto& [key, m] : chunks_[c].steady) units.push_back({c, key.first, key.second, m.sum, m.n});
  j["adapt"] = {{"since", steady_.since}, {"actions", actions}, {"units", units}, {"profiled_refresh", profiled_refresh_}};
}

// The steady state (the profile's plan's cycles: load_profiled_refresh, with the plan).
void Controller::load_adapt(const nlohmann::json& j, int64_t plan_start) {
  restart_steady(plan_start);
  if (!j.contains("adapt")) return;  // a checkpoint of a build without adapting
  const nlohmann::json& a = j.at("adapt");
  steady_.since = a.at("since").get<int64_t>();
  const auto& actions = a.at("actions");
  PF_CHECK(actions.size() == lowered_.size(), "adaptive steady state of {} actions, this device has {}",
           actions.size(), lowered_.size());
  for (size_t i = 0; i < actions.size(); ++i) steady_.actions[i] = {actions[i][0].get<double>(), actions[i][1].get<int>()};
  for (const auto& u : a.at("units"))
    chunks_.at(u[0].get<size_t>()).steady[{u[1].get<int>(), u[2].get<int>()}] = {u[3].get<double>(), u[4].get<int>()};
}

}  // namespace pf
