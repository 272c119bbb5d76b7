// PipeFisher's phases (phases.hpp, controller.hpp): each phase's lists and the plan's step it
// runs, and its step end, which returns the next phase: the profile's timings summed (and at its
// last step the plan), drift deciding a drain, a drain's end starting a re-profile, adaptive's
// switch to a re-plan. The profile in checkpoints.
#include "runtime/pipefisher/controller.hpp"

#include "comm/small.hpp"
#include "core/error.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

namespace pf {

const std::vector<Action>& Controller::list(const Planned& p, int64_t t) const {
  return plan_->actions(groups_.replica, device_, t - p.plan_start);
}

// Before its boundary the device finishes its cycle as planned.
const std::vector<Action>& Controller::list(const Draining& p, int64_t t) const {
  if (t < p.boundary) return plan_->actions(groups_.replica, device_, t - p.plan_start);
  return t == p.boundary ? p.first : p.plain;
}

std::optional<int64_t> Controller::plan_step(const Draining& p, int64_t t) const {
  if (t < p.boundary) return t - p.plan_start;
  return std::nullopt;
}

// The profiled step's timings added to the profile; at its last step, the plan.
Phase Controller::after(Profiling p, int64_t step, const std::vector<Action>& list, const std::vector<ActionTime>& times) {
  add_profile_step(p, step, list, times);
  if (step + 1 < p.start + kProfileSteps) return p;
  plan_from_profile(p.start, step + 1);
  restart_steady(step + 1);
  return Planned{step + 1, 0};
}

// The drift check (PipeFisherOptions::replans_on_drift: not with a recorded profile); adaptive:
// the step's timings summed, and at a cycle start of every device the re-plan it may switch to.
Phase Controller::after(Planned p, int64_t step, const std::vector<Action>& list, const std::vector<ActionTime>& times) {
  std::optional<Draining> drain;
  if (opts_.replans_on_drift) drain = check_drift(p, step, list, times);
  if (opts_.adapts) {
    measure_steady(list, times);
    if (!drain && adapt_due(step, p.plan_start))
      if (std::optional<std::vector<Action>> first = adapt(step)) return Switching{step + 1, std::move(*first), p.drift_steps};
  }
  if (drain) return settle(std::move(*drain), step + 1);
  return p;
}

// (adaptive: the plan's steps before the boundary are summed as any planned step's.)
Phase Controller::after(Draining p, int64_t step, const std::vector<Action>& list, const std::vector<ActionTime>& times) {
  if (opts_.adapts && step < p.boundary) measure_steady(list, times);
  return settle(std::move(p), step + 1);
}

// The switching step ends as any step of the plan it switched to.
Phase Controller::after(Switching p, int64_t step, const std::vector<Action>& list, const std::vector<ActionTime>& times) {
  return after(Planned{p.at, p.drift_steps}, step, list, times);
}

// Profiling steps from `start`; after a drain whose boundary was `start` the first step runs the
// ended cycle's wrapped units first (the plan's: they are due at the front of its cycle step 0).
Profiling Controller::profiling(int64_t start, int64_t plan_start, int64_t drained_boundary) const {
  Profiling p{start, plan_start, drained_boundary, {}};
  if (drained_boundary == start) {
    p.first.actions = plan_->wrapped(groups_.replica, device_, 0);
    p.first.lowered_index.assign(p.first.actions.size(), -1);
  }
  p.first.actions.insert(p.first.actions.end(), inline_.actions.begin(), inline_.actions.end());
  p.first.lowered_index.insert(p.first.lowered_index.end(), inline_.lowered_index.begin(), inline_.lowered_index.end());
  return p;
}

void Controller::add_profile_step(const Profiling& p, int64_t step, const std::vector<Action>& list,
                                  const std::vector<ActionTime>& times) {
  if (step == p.start) {  // a fresh profile
    std::fill(profile_.action_ms.begin(), profile_.action_ms.end(), 0.0);
    profile_.samples = 0;
    for (ChunkMeasures& c : chunks_) c.profiled = {};
  }
  const std::vector<int>& lowered_index = profiled(p, step).lowered_index;
  PF_CHECK(list.size() == lowered_index.size() && times.size() == list.size(),
           "profiled step {}: {} actions, {} times, a profiled list of {}", step, list.size(), times.size(),
           lowered_index.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const int j = lowered_index[i];
    if (j >= 0) profile_.action_ms[j] += static_cast<double>(times[i].end - times[i].start - times[i].wait) / 1e6;
  }
  ++profile_.samples;
}

std::optional<Draining> Controller::check_drift(Planned& p, int64_t step, const std::vector<Action>& list,
                                                const std::vector<ActionTime>& times) {
  double compute = 0;
  for (size_t i = 0; i < list.size() && i < times.size(); ++i)
    if (is_pass(list[i].kind)) compute += static_cast<double>(times[i].end - times[i].start - times[i].wait) / 1e6;
  return drift(p, step, compute);
}

// Drift: this rank's forward/backward time of a step (the durations the plan was made from;
// the whole step also counts waits, which the plan does not model) over 1.3x its profile for 3
// steps on any rank means the durations no longer match the profile. The decision is collective
// (every rank must switch at the same step): each device finishes its current cycle (its
// boundary), runs plain steps until the last device's boundary, then all re-profile
// (kProfileSteps inline steps) and re-plan.
// Tests only: --test-drift-at counts three steps as 10x their measured time.
std::optional<Draining> Controller::drift(Planned& p, int64_t step, double ms) {
  if (seams_.drifts(step)) ms *= 10;
  const double planned = planned_compute_ms_;
  // Over 30% and over 1 ms: scheduler noise on a tiny step is not drift.
  p.drift_steps = ms > 1.3 * planned && ms > planned + 1.0 ? p.drift_steps + 1 : 0;
  double flag = p.drift_steps >= 3 ? 1 : 0;
  comm::allreduce_sum({&flag, 1}, MPI_COMM_WORLD, "the drift decision");
  if (flag == 0) return std::nullopt;
  p.drift_steps = 0;
  const int64_t next = step + 1 - p.plan_start;  // plan step of the next training step
  Draining d = draining(p.plan_start, p.plan_start + plan_->next_cycle_start(device_, next),
                        p.plan_start + plan_->all_cycles_start(next));
  if (groups_.rank == 0) {
    std::printf("pipefisher: step %lld: forward/backward %.1f ms, over 30%% above the profiled %.1f ms for 3 steps "
                "(on some rank): durations drifted; re-profiling from step %lld and re-planning\n",
                static_cast<long long>(step) + 1, ms, planned, static_cast<long long>(d.replan_at) + 1);
    std::fflush(stdout);
  }
  return d;
}

// A drain's lists from the plan. The cycle's units wrapped into the next cycle's leading gap (the
// front of cycle step 0) still run, first thing at the boundary; then only F/B, communication,
// PREC and OPT. (Chimera's group wraps inversions up to cycle step K: those of steps 1..K do not
// run; their inverses would be pending until a sync that does not come, and re-profiling drops
// them.)
Draining Controller::draining(int64_t plan_start, int64_t boundary, int64_t replan_at) const {
  Draining d{plan_start, boundary, replan_at, plan_->wrapped(groups_.replica, device_, 0),
             plan_->plain_actions(groups_.replica, device_)};
  d.first.insert(d.first.end(), d.plain.begin(), d.plain.end());
  return d;
}

// At replan_at every device profiles again (a drain may end before it began).
Phase Controller::settle(Draining d, int64_t next) const {
  if (next < d.replan_at) return d;
  return profiling(d.replan_at, d.plan_start, d.boundary);
}

// Checkpoints: the profile's sums.
void Controller::save_profile(nlohmann::json& j) const {
  j["dur_sum"] = profile_.action_ms;
  j["dur_samples"] = profile_.samples;
  nlohmann::json times = nlohmann::json::array();
  for (const ChunkMeasures& c : chunks_) {
    const ChunkKfacTimes& t = c.profiled;
    times.push_back({t.curv_a, t.curv_b, t.inv_a, t.inv_b, t.prec, t.sync, t.curv_samples, t.inv_samples, t.prec_samples});
  }
  j["times"] = times;
}

void Controller::load_profile(const nlohmann::json& j) {
  profile_.action_ms = j.at("dur_sum").get<std::vector<double>>();
  PF_CHECK(profile_.action_ms.size() == lowered_.size(), "K-FAC profile of {} actions, this device has {}",
           profile_.action_ms.size(), lowered_.size());
  profile_.samples = j.at("dur_samples").get<int>();
  const nlohmann::json& times = j.at("times");
  PF_CHECK(times.size() == chunks_.size(), "K-FAC profile of {} chunks, this rank hosts {}", times.size(),
           chunks_.size());
  for (size_t c = 0; c < times.size(); ++c) {
    const nlohmann::json& u = times[c];
    ChunkKfacTimes& t = chunks_[c].profiled = {};
    u[0].get_to(t.curv_a), u[1].get_to(t.curv_b), u[2].get_to(t.inv_a), u[3].get_to(t.inv_b);
    t.prec = u[4].get<double>(), t.sync = u[5].get<double>();
    t.curv_samples = u[6].get<int>(), t.inv_samples = u[7].get<int>(), t.prec_samples = u[8].get<int>();
  }
}

}  // namespace pf
