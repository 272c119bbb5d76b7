// PipeFisher's controller (controller.hpp): the step's list, plan row and chunks' work asked of the
// phase; at the step's end the phase the phase returns; the phase and profile in checkpoints.
#include "runtime/pipefisher/controller.hpp"

#include "comm/small.hpp"
#include "core/error.hpp"
#include "plan/planned_row.hpp"
#include "runtime/plan_record.hpp"

#include <nlohmann/json.hpp>

#include <type_traits>
#include <variant>

namespace pf {

Controller::Controller(PipeFisherOptions options, std::unique_ptr<StepDriver> driver, const Layout& layout,
                       const comm::Groups& groups, KfacUnits& units, const KfacSeams& seams)
    : opts_(std::move(options)),
      driver_(std::move(driver)),
      layout_(layout),
      groups_(groups),
      units_(units),
      seams_(seams),
      device_(groups.stage),
      lowered_(layout.schedule.per_device.at(groups.stage)),
      profile_{std::vector<double>(lowered_.size(), 0.0), 0},
      chunks_(units.hosted().size()) {
  // Inline list: each chunk's PREC (in stage order: their factor sums are blocking collectives)
  // just before the device's first OPT.
  InlineStep inline_step = profiling_actions(layout.schedule, device_);
  inline_ = {std::move(inline_step.actions), std::move(inline_step.step_index)};
  phase_ = profiling(0, kProfileSteps, -1);
  units.set_inverter([this](const Action& a) {
    const auto owner = plan_->inverter(a);
    PF_CHECK(owner.has_value(), "{}: a broadcast of a piece every holder inverts", to_token(a));
    return groups_.world_rank(owner->first, owner->second);
  });
}

const std::vector<Action>& Controller::actions_for(int64_t step) const {
  return std::visit([&](const auto& p) -> const std::vector<Action>& { return list(p, step); }, phase_);
}

// The plan's timeline of a step that runs the plan (none while profiling or draining).
std::vector<TimedAction> Controller::planned_row(int64_t step) const {
  const std::optional<int64_t> k = std::visit([&](const auto& p) { return plan_step(p, step); }, phase_);
  if (!k) return {};
  return pf::planned_row(*plan_, groups_.replica, device_, *k);
}

// The plan in use's step 0 (a switch's step is the re-plan's).
int64_t Controller::plan_start() const {
  return std::visit([](const auto& p) -> int64_t {
    if constexpr (std::is_same_v<std::decay_t<decltype(p)>, Switching>) return p.at;
    else return p.plan_start;
  }, phase_);
}

// What each chunk saves and what its PREC does in the step's phase: profiling saves and times
// every unit at PREC; a step that runs the plan saves on its cycle's first step; a drain's steps
// from the boundary start no new cycle before re-profiling.
bool Controller::begin_step(int64_t step, const std::vector<MicroBatch>& mbs) {
  units_.begin_step(step);
  const float scale = mbs.empty() ? 1.0f : mbs.front().loss_scale;
  const bool profiles = std::holds_alternative<Profiling>(phase_);
  const std::optional<int64_t> k = std::visit([&](const auto& p) { return plan_step(p, step); }, phase_);
  const bool cycle_start = k && plan_->is_cycle_start(device_, *k);
  for (size_t i = 0; i < units_.hosted().size(); ++i)
    units_.hosted()[i].kfac->begin_units_step(step, profiles || cycle_start, scale,
                                              profiles ? &chunks_[i].profiled : nullptr);
  return true;  // stamps: profiling, and the drift check
}

// The phase becomes what its step end returns (controller_phases.cpp): itself or the next.
void Controller::after_step(int64_t step, const std::vector<Action>& list, const std::vector<ActionTime>& times) {
  phase_ = std::visit([&](auto& p) { return after(p, step, list, times); }, phase_);
}

// The phase in checkpoints, in the keys earlier builds wrote (a phase's own steps decode to it
// again: phase_of).
PhaseRecord Controller::record_of(const Phase& phase) const {
  struct Record {
    PhaseRecord operator()(const Profiling& p) const {
      return {p.start, p.plan_start, p.drained_boundary, p.drained_boundary >= 0 ? p.start : -1, 0, -1, {}};
    }
    PhaseRecord operator()(const Planned& p) const {
      return {p.plan_start - kProfileSteps, p.plan_start, -1, -1, p.drift_steps, -1, {}};
    }
    PhaseRecord operator()(const Draining& p) const { return {p.replan_at, p.plan_start, p.boundary, p.replan_at, 0, -1, {}}; }
    PhaseRecord operator()(const Switching& p) const {
      return {p.at - kProfileSteps, p.at, -1, -1, p.drift_steps, p.at, p.first};
    }
  };
  return std::visit(Record{}, phase);
}

// The phase of step t (the checkpoint's next) from its record, as earlier builds read it: the
// profile's steps (or no plan yet), a drain under way, the switch's step, else the plan.
Phase Controller::phase_of(const PhaseRecord& r, int64_t t) const {
  if (!plan_ || (t >= r.profile_start && t < r.profile_start + kProfileSteps))
    return profiling(r.profile_start, r.plan_start, r.replan_at >= 0 ? r.boundary : -1);
  if (r.replan_at >= 0 && t < r.replan_at) return draining(r.plan_start, r.boundary, r.replan_at);
  if (t == r.switch_at) return Switching{r.switch_at, r.switch_first, r.drift_steps};
  return Planned{r.plan_start, r.drift_steps};
}

// Checkpoints: the phase and the profile here and in controller_phases.cpp, the plan's input in
// controller_plan.cpp, the steady state in controller_adapt.cpp.
void Controller::save_state(nlohmann::json& j) const {
  save_profile(j);
  const PhaseRecord r = record_of(phase_);
  j["drift_steps"] = r.drift_steps;
  j["profile_start"] = r.profile_start;
  j["plan_start"] = r.plan_start;
  j["boundary"] = r.boundary;
  j["replan_at"] = r.replan_at;
  save_plan(j);
  save_adapt(j);
  nlohmann::json first = nlohmann::json::array();
  for (const Action& a : r.switch_first) first.push_back(to_token(a));
  j["adapt"]["switch_at"] = r.switch_at;
  j["adapt"]["switch_first"] = first;
}

void Controller::load_state(const nlohmann::json& j, const std::string& where, int64_t next_step) {
  load_profile(j);
  PhaseRecord r;
  r.drift_steps = j.at("drift_steps").get<int>();
  r.profile_start = j.at("profile_start").get<int64_t>();
  r.plan_start = j.at("plan_start").get<int64_t>();
  r.boundary = j.at("boundary").get<int64_t>();
  r.replan_at = j.at("replan_at").get<int64_t>();
  if (j.contains("adapt")) {  // (a checkpoint of a build without adapting has none)
    r.switch_at = j.at("adapt").at("switch_at").get<int64_t>();
    for (const auto& t : j.at("adapt").at("switch_first"))
      r.switch_first.push_back(parse_token(t.get<std::string>(), "checkpoint"));
  }
  load_plan(j, where);  // the plan in use, remade from its input
  load_adapt(j, r.plan_start);
  phase_ = phase_of(r, next_step);
}

}  // namespace pf
