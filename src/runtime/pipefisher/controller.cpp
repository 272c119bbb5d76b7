// PipeFisher's controller (controller.hpp): which list a step runs, what each hosted chunk does in
// it, the profile's timings at step end, drift deciding a drain and a re-profile.
#include "runtime/pipefisher/controller.hpp"

#include "comm/small.hpp"
#include "core/error.hpp"
#include "plan/planned_row.hpp"
#include "runtime/plan_record.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

namespace pf {

namespace {
nlohmann::json times_json(const ChunkKfacTimes& t) {
  return {t.curv_a, t.curv_b, t.inv_a, t.inv_b, t.prec, t.sync, t.curv_samples, t.inv_samples, t.prec_samples};
}
ChunkKfacTimes times_of(const nlohmann::json& j) {
  ChunkKfacTimes t;
  j[0].get_to(t.curv_a), j[1].get_to(t.curv_b), j[2].get_to(t.inv_a), j[3].get_to(t.inv_b);
  t.prec = j[4].get<double>(), t.sync = j[5].get<double>();
  t.curv_samples = j[6].get<int>(), t.inv_samples = j[7].get<int>(), t.prec_samples = j[8].get<int>();
  return t;
}
}  // namespace

Controller::Controller(PipeFisherOptions options, std::unique_ptr<StepDriver> driver, const Layout& layout,
                       const comm::Groups& groups, KfacUnits& units, const KfacSeams& seams)
    : opts_(std::move(options)),
      driver_(std::move(driver)),
      layout_(layout),
      groups_(groups),
      units_(units),
      seams_(seams),
      device_(groups.stage),
      lowered_(layout.schedule.per_device.at(groups.stage)) {
  // Inline list: each chunk's PREC (in stage order: their factor sums are blocking collectives)
  // just before the device's first OPT.
  InlineStep inline_step = profiling_actions(layout.schedule, device_);
  inline_ = {std::move(inline_step.actions), std::move(inline_step.step_index)};
  profile_.action_ms.assign(lowered_.size(), 0.0);
  profile_.chunks.resize(units.hosted().size());
  units.set_inverter([this](const Action& a) {
    const auto owner = plan_->inverter(a);
    PF_CHECK(owner.has_value(), "{}: a broadcast of a piece every holder inverts", to_token(a));
    return groups_.world_rank(owner->first, owner->second);
  });
}

const std::vector<Action>& Controller::actions_for(int64_t step) const {
  if (profiling(step)) return profiled_list(step).actions;
  if (draining(step)) return step == phase_.boundary ? drain_first_ : drain_plain_;
  if (step == switch_.at) return switch_.first;
  return plan_->actions(groups_.replica, device_, step - phase_.plan_start);
}

std::vector<TimedAction> Controller::planned_row(int64_t step) const {
  if (profiling(step) || draining(step)) return {};
  return pf::planned_row(*plan_, groups_.replica, device_, step - phase_.plan_start);
}

bool Controller::begin_step(int64_t step, const std::vector<MicroBatch>& mbs) {
  units_.begin_step(step);
  const float scale = mbs.empty() ? 1.0f : mbs.front().loss_scale;
  for (size_t i = 0; i < units_.hosted().size(); ++i) configure_chunk(units_.hosted()[i], i, step, scale);
  return true;  // stamps: profiling, and the drift check
}

// What one chunk saves and what its PREC does in the step's phase.
void Controller::configure_chunk(HostedKfac& h, size_t index, int64_t step, float scale) {
  if (profiling(step)) {
    h.kfac->begin_step(step, true, false, scale);  // save, then timed units at PREC
    h.prec = {PrecWork::Kind::profile, true, true, &profile_.chunks[index]};
  } else if (draining(step)) {
    h.kfac->begin_step(step, false, false, scale);  // no new cycle before re-profiling
    h.prec = {};
  } else {
    h.kfac->begin_step(step, plan_->is_cycle_start(device_, step - phase_.plan_start), false, scale);
    h.prec = {};
  }
}

void Controller::after_step(int64_t step, const std::vector<Action>& list, const std::vector<ActionTime>& times) {
  if (profiling(step)) {
    add_profile_step(step, list, times);
    return;
  }
  check_drift(step, list, times);
  if (!opts_.adapts || draining(step)) return;
  measure_steady(list, times);
  if (adapt_due(step) && adapt(step)) phase_.plan_start = step + 1;  // the re-plan's step 0
}

// The profiled step's timings added to the profile; at its last step, the plan.
void Controller::add_profile_step(int64_t step, const std::vector<Action>& list, const std::vector<ActionTime>& times) {
  if (step == phase_.profile_start) {  // a fresh profile
    std::fill(profile_.action_ms.begin(), profile_.action_ms.end(), 0.0);
    profile_.samples = 0;
    for (ChunkKfacTimes& t : profile_.chunks) t = {};
  }
  const std::vector<int>& lowered_index = profiled_list(step).lowered_index;
  PF_CHECK(list.size() == lowered_index.size() && times.size() == list.size(),
           "profiled step {}: {} actions, {} times, a profiled list of {}", step, list.size(), times.size(),
           lowered_index.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const int j = lowered_index[i];
    if (j >= 0) profile_.action_ms[j] += static_cast<double>(times[i].end - times[i].start - times[i].wait) / 1e6;
  }
  ++profile_.samples;
  if (step + 1 == phase_.profile_start + kProfileSteps) {
    phase_.plan_start = step + 1;
    phase_.replan_at = -1;
    plan_from_profile();
    restart_steady(phase_.plan_start);
  }
}

// Not with a recorded profile, which fixes the plan (PipeFisherOptions::replans_on_drift).
void Controller::check_drift(int64_t step, const std::vector<Action>& list, const std::vector<ActionTime>& times) {
  if (phase_.replan_at >= 0 || !opts_.replans_on_drift) return;
  double compute = 0;
  for (size_t i = 0; i < list.size() && i < times.size(); ++i)
    if (is_pass(list[i].kind)) compute += static_cast<double>(times[i].end - times[i].start - times[i].wait) / 1e6;
  drift(step, compute);
}

// Drift: this rank's forward/backward time of a step (the durations the plan was made from;
// the whole step also counts waits, which the plan does not model) over 1.3x its profile for 3
// steps on any rank means the durations no longer match the profile. The decision is collective
// (every rank must switch at the same step): each device finishes its current cycle (its
// boundary), runs plain steps until the last device's boundary, then all re-profile
// (kProfileSteps inline steps) and re-plan.
// Tests only: --test-drift-at counts three steps as 10x their measured time.
void Controller::drift(int64_t step, double ms) {
  if (seams_.drifts(step)) ms *= 10;
  const double planned = planned_compute_ms_;
  // Over 30% and over 1 ms: scheduler noise on a tiny step is not drift.
  phase_.drift_steps = ms > 1.3 * planned && ms > planned + 1.0 ? phase_.drift_steps + 1 : 0;
  double flag = phase_.drift_steps >= 3 ? 1 : 0;
  comm::allreduce_sum({&flag, 1}, MPI_COMM_WORLD, "the drift decision");
  if (flag == 0) return;
  phase_.drift_steps = 0;
  const int64_t next = step + 1 - phase_.plan_start;  // plan step of the next training step
  phase_.replan_at = phase_.plan_start + plan_->all_cycles_start(next);
  phase_.boundary = phase_.plan_start + plan_->next_cycle_start(device_, next);
  phase_.profile_start = phase_.replan_at;
  drain_lists();
  if (groups_.rank == 0) {
    std::printf("pipefisher: step %lld: forward/backward %.1f ms, over 30%% above the profiled %.1f ms for 3 steps "
                "(on some rank): durations drifted; re-profiling from step %lld and re-planning\n",
                static_cast<long long>(step) + 1, ms, planned, static_cast<long long>(phase_.replan_at) + 1);
    std::fflush(stdout);
  }
}

// The lists of a drain (boundary .. replan_at) and of its re-profiling step, from the plan.
void Controller::drain_lists() {
  const KfacPlan& p = *plan_;
  // The cycle's units wrapped into the next cycle's leading gap (the front of cycle step 0) still
  // run, first thing at the boundary; then only F/B, communication, PREC and OPT.
  // (Chimera's group wraps inversions up to cycle step K: those of steps 1..K do not run; their
  // inverses would be pending until a sync that does not come, and re-profiling drops them.)
  const std::vector<Action> wrapped = p.wrapped(groups_.replica, device_, 0);
  drain_plain_ = p.plain_actions(groups_.replica, device_);
  drain_first_ = wrapped;
  drain_first_.insert(drain_first_.end(), drain_plain_.begin(), drain_plain_.end());
  reprofile_first_ = {};
  if (phase_.boundary == phase_.replan_at) {
    reprofile_first_.actions = wrapped;
    reprofile_first_.lowered_index.assign(wrapped.size(), -1);
  }
  ProfiledList& first = reprofile_first_;
  first.actions.insert(first.actions.end(), inline_.actions.begin(), inline_.actions.end());
  first.lowered_index.insert(first.lowered_index.end(), inline_.lowered_index.begin(), inline_.lowered_index.end());
}

// Checkpoints: the phase and the profile here, the plan's input in controller_plan.cpp.
void Controller::save_state(nlohmann::json& j) const {
  j["dur_sum"] = profile_.action_ms;
  j["dur_samples"] = profile_.samples;
  nlohmann::json times = nlohmann::json::array();
  for (const ChunkKfacTimes& t : profile_.chunks) times.push_back(times_json(t));
  j["times"] = times;
  j["drift_steps"] = phase_.drift_steps;
  j["profile_start"] = phase_.profile_start;
  j["plan_start"] = phase_.plan_start;
  j["boundary"] = phase_.boundary;
  j["replan_at"] = phase_.replan_at;
  save_plan(j);
  save_adapt(j);
}

void Controller::load_state(const nlohmann::json& j, const std::string& where) {
  profile_.action_ms = j.at("dur_sum").get<std::vector<double>>();
  PF_CHECK(profile_.action_ms.size() == lowered_.size(), "K-FAC profile of {} actions, this device has {}",
           profile_.action_ms.size(), lowered_.size());
  profile_.samples = j.at("dur_samples").get<int>();
  profile_.chunks.clear();
  for (const auto& t : j.at("times")) profile_.chunks.push_back(times_of(t));
  phase_.drift_steps = j.at("drift_steps").get<int>();
  phase_.profile_start = j.at("profile_start").get<int64_t>();
  phase_.plan_start = j.at("plan_start").get<int64_t>();
  phase_.boundary = j.at("boundary").get<int64_t>();
  phase_.replan_at = j.at("replan_at").get<int64_t>();
  load_plan(j, where);  // the plan in use, remade from its input
  load_adapt(j);
  if (plan_ && phase_.replan_at >= 0) drain_lists();
}

}  // namespace pf
