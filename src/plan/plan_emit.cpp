// The planner's last passes (see planner.cpp): cycle lengths, the placed units and the per-step
// action lists of every replica's device (optimizer included), and the plan's measures.
#include "core/error.hpp"
#include "plan/plan_state.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace pf::plan {

// Cycle lengths: per device (max over replicas; Chimera's group: over the twins), or one for all
// when inline work exists (or Chimera without the group).
void set_cycle_lengths(PlanState& state) {
  KfacPlan& plan = state.plan;
  const int D = state.devices();
  plan.common_cycle = state.any_inline || (state.chimera() && !state.per_pair());
  plan.sync_steps.clear();
  for (const CollectivePin& pin : state.pins) plan.sync_steps.push_back(pin.sync_step);
  plan.sync_step = *std::max_element(plan.sync_steps.begin(), plan.sync_steps.end());
  plan.refresh_steps.assign(D, 1);
  for (int d = 0; d < D; ++d)
    for (const DevicePlacement& placed : state.packed[d].replicas)
      plan.refresh_steps[d] = std::max(plan.refresh_steps[d], placed.needed);
  if (state.per_pair()) {
    const std::vector<int> r = plan.refresh_steps;
    for (int d = 0; d < D; ++d) plan.refresh_steps[d] = std::max(r[d], r[D - 1 - d]);
  }
  if (plan.common_cycle) plan.refresh_steps.assign(D, *std::max_element(plan.refresh_steps.begin(), plan.refresh_steps.end()));
  plan.step0 = state.cycle_step0[0].timeline;
  plan.step0_time = 0;
  for (const CycleStep0& step0 : state.cycle_step0) plan.step0_time = std::max(plan.step0_time, step0.timeline.step_time);
}

namespace {

// A unit going into a cycle step's list: at position `at` of the step's planned list, ordered
// by start among units at the same position.
struct Insertion {
  int step, at;
  double start;
  int unit;
  bool wrapped;
};

// One replica's device during emission: its insertions and K-FAC time per cycle.
struct DeviceEmit {
  std::vector<Insertion> insertions;
  double work = 0, inline_work = 0, busy_kfac = 0, pinned_time = 0;
};

// Inline units (cycle step 0, timed in its schedule) and gap units (where the packing put them).
void emit_placed_units(const PlanState& state, int w, int d, DeviceEmit& e, PlanLists& out) {
  const KfacPlan& plan = state.plan;
  const CycleStep0& step0 = state.cycle_step0[w];
  const DevicePlacement& placed = state.packed[d].replicas[w];
  const CollectivePin pin = state.pins[d];
  const auto& units = state.packed[d].units.units;
  const int R = plan.refresh_steps[d];
  for (auto [i, index] : step0.inline_at[d]) {
    const TimedAction& t = step0.timeline.per_device[d][index];
    out.units.push_back({units[i].action, w, d, 0, t.start, t.end, true, false});
    e.inline_work += units[i].duration;
  }
  for (size_t i = 0; i < units.size(); ++i) {
    if (!runs_on(units[i], w)) continue;
    e.work += units[i].duration;
    if (is_compute(units[i].action.kind)) e.busy_kfac += units[i].duration;
    if (placed.gap_of[i] < 0) continue;
    const Placer::StepGap& g = placed.placer.gaps[placed.gap_of[i]];
    // Wrapped: in the next cycle's step g.step - R (its leading gap of step 0, or with a period
    // up to its step K), listed in this cycle step from the second cycle on.
    const bool wrapped = g.step >= R;
    PF_CHECK(g.step < R || (pin.period > 0 ? g.step <= R + pin.sync_step : g.step == R && g.gap.leading),
             "unit beyond its cycle");
    const int step = wrapped ? g.step - R : g.step;
    const double start = placed.start[i] - placed.placer.offset(g.step);
    e.insertions.push_back({step, g.gap.insert_at, start, static_cast<int>(i), wrapped});
    out.units.push_back({units[i].action, w, d, step, start, start + units[i].duration, false, wrapped});
  }
}

// Pinned units (Chimera): after everything of cycle step K, per stage (stage order) its
// broadcasts (chain order) and its sync; then the inversions that could not go into any gap.
void emit_pinned_units(const PlanState& state, int w, int d, DeviceEmit& e, PlanLists& out) {
  const KfacPlan& plan = state.plan;
  const CycleStep0& step0 = state.cycle_step0[w];
  const auto& units = state.packed[d].units.units;
  std::vector<int> pinned;
  for (size_t i = 0; i < units.size(); ++i)
    if (units[i].pinned && runs_on(units[i], w)) pinned.push_back(static_cast<int>(i));
  std::stable_sort(pinned.begin(), pinned.end(), [&](int a, int b) {
    const bool ia = !is_collective(units[a].action.kind), ib = !is_collective(units[b].action.kind);
    return std::tuple(ia, units[a].action.stage, units[a].action.pipeline, units[a].action.kind == Kind::SYNC_CURV) <
           std::tuple(ib, units[b].action.stage, units[b].action.pipeline, units[b].action.kind == Kind::SYNC_CURV);
  });
  const int K = state.pins[d].sync_step;
  const int at = static_cast<int>((K == 0 ? step0.step.schedule : state.base.schedule).per_device[d].size());
  double t = K == 0 ? step0.timeline.step_time : plan.base.step_time;
  for (int i : pinned) {
    e.insertions.push_back({K, at, t, i, false});
    PlacedUnit pu{units[i].action, w, d, K, t, t + units[i].duration, true, false};
    pu.at_step_end = true;
    out.units.push_back(pu);
    t += units[i].duration;
    e.inline_work += units[i].duration;
    e.pinned_time += units[i].duration;
  }
}

// The lists of cycle steps 0..R-1 (steady state, and the first cycle without wrapped units),
// the wrapped units per step, and the optimizer steps at the end of every list.
void build_lists(const PlanState& state, int w, int d, DeviceEmit& e, PlanLists& out) {
  const auto& units = state.packed[d].units.units;
  const int R = state.plan.refresh_steps[d];
  // Insert back to front (by position, then start) into each step's list.
  std::stable_sort(e.insertions.begin(), e.insertions.end(), [](const Insertion& a, const Insertion& b) {
    return a.step != b.step ? a.step < b.step : a.at != b.at ? a.at > b.at : a.start > b.start;
  });
  auto& lists = out.cycle[w][d];
  for (int k = 0; k < R; ++k)
    lists.push_back(k == 0 ? state.cycle_step0[w].step.schedule.per_device[d] : state.base.schedule.per_device[d]);
  for (const Insertion& x : e.insertions) lists[x.step].insert(lists[x.step].begin() + x.at, units[x.unit].action);
  for (int k = 0; k < R; ++k) {
    std::vector<Action> wrapped_actions, list, wrapped_in_order;
    for (const Insertion& x : e.insertions)
      if (x.wrapped && x.step == k) wrapped_actions.push_back(units[x.unit].action);
    for (const Action& a : lists[k]) {
      auto it = std::find(wrapped_actions.begin(), wrapped_actions.end(), a);
      if (it != wrapped_actions.end()) wrapped_actions.erase(it), wrapped_in_order.push_back(a);
      else list.push_back(a);
    }
    out.first_cycle[w][d].push_back(std::move(list));
    out.wrapped_units[w][d].push_back(std::move(wrapped_in_order));
  }
  const auto& opt = state.optimizer[d];
  for (auto* step_lists : {&out.cycle[w][d], &out.first_cycle[w][d]})
    for (auto& list : *step_lists) list.insert(list.end(), opt.begin(), opt.end());
}

// The factors run as diagonal blocks (those split to shorten the refresh period after the
// others, each group in device order) and every hosted stage's inversion placement.
void emit_splits_and_placements(const PlanState& state, PlanLists& out) {
  for (bool shortened : {false, true})
    for (const PackedDevice& packed : state.packed)
      if (packed.split_to_shorten == shortened)
        out.splits.insert(out.splits.end(), packed.units.splits.begin(), packed.units.splits.end());
  for (int d = 0; d < state.devices(); ++d)
    for (StagePlacement placement : state.packed[d].units.placements) {
      placement.device = d;
      out.placements.push_back(std::move(placement));
    }
}

}  // namespace

void emit_lists(PlanState& state) {
  KfacPlan& plan = state.plan;
  const int D = state.devices(), W = state.replicas();
  PlanLists lists;
  emit_splits_and_placements(state, lists);
  lists.cycle.assign(W, std::vector<std::vector<std::vector<Action>>>(D));
  lists.first_cycle = lists.wrapped_units = lists.cycle;
  plan.kfac_work.assign(D, 0);
  plan.device_inline.assign(D, 0);
  plan.utilization_per_device.assign(D, 0);
  for (int w = 0; w < W; ++w)
    for (int d = 0; d < D; ++d) {
      DeviceEmit e;
      emit_placed_units(state, w, d, e, lists);
      emit_pinned_units(state, w, d, e, lists);
      plan.kfac_work[d] = std::max(plan.kfac_work[d], e.work);
      plan.device_inline[d] = std::max(plan.device_inline[d], e.inline_work);
      build_lists(state, w, d, e, lists);
      // Utilization over the device's cycle: F/B/PREC each step plus one cycle of K-FAC work.
      const int R = plan.refresh_steps[d];
      const double time = plan.step0_time + (R - 1) * plan.base_step_time + e.pinned_time;
      const double busy_steps = R * plan.base.busy[d];
      plan.utilization_per_device[d] += (busy_steps + e.busy_kfac) / time / W;
    }
  plan.lists_ = std::move(lists);
}

// Bubble, precondition and lower bound per device, mean utilization, and the step time with Chimera's pinned
// units (they lengthen cycle step K: the busiest device's, as a bound). With one cycle for all,
// once per period; with a cycle per pair of twins, each pair's once per its cycle, and the
// pairs' lengthened steps may fall apart: their sum bounds the mean.
void measure(PlanState& state) {
  KfacPlan& plan = state.plan;
  const int D = state.devices();
  plan.bubble.assign(D, 0);
  plan.precondition.assign(D, 0);
  plan.lower_bound_refresh_steps.assign(D, -1);
  for (int d = 0; d < D; ++d) {
    for (const Gap& g : plan.base.gaps(d)) plan.bubble[d] += g.end - g.start;
    for (const TimedAction& a : plan.base.per_device[d])
      if (a.action.kind == Kind::PREC) plan.precondition[d] += a.end - a.start;
    if (plan.bubble[d] > kEps)
      plan.lower_bound_refresh_steps[d] = static_cast<int>(std::ceil(plan.kfac_work[d] / plan.bubble[d] - 1e-12));
  }
  plan.utilization = std::accumulate(plan.utilization_per_device.begin(), plan.utilization_per_device.end(), 0.0) / D;
  const int P = plan.period();
  double pinned = 0, pinned_per_step = 0;
  std::vector<double> pinned_of(D, 0.0);
  for (const PlacedUnit& u : plan.units())
    if (u.at_step_end)
      pinned_of[u.device] = std::max(pinned_of[u.device], u.end - (u.step == 0 ? plan.step0_time : plan.base_step_time));
  for (int d = 0; d < D; ++d) {
    pinned = std::max(pinned, pinned_of[d]);
    if (d <= D - 1 - d) pinned_per_step += std::max(pinned_of[d], pinned_of[D - 1 - d]) / plan.refresh_steps[d];
  }
  plan.inline_time = plan.step0_time - plan.base_step_time + pinned;
  plan.step_time = plan.common_cycle ? (plan.step0_time + (P - 1) * plan.base_step_time + pinned) / P
                                     : plan.base_step_time + pinned_per_step;
}

}  // namespace pf::plan
