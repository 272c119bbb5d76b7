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
Cycles set_cycle_lengths(const PlanState& state) {
  const int D = state.devices();
  Cycles c;
  c.common_cycle = state.any_inline() || (state.chimera() && !state.per_pair());
  for (const CollectivePin& pin : state.pins) c.sync_steps.push_back(pin.sync_step);
  c.sync_step = *std::max_element(c.sync_steps.begin(), c.sync_steps.end());
  c.refresh_steps.assign(D, 1);
  for (int d = 0; d < D; ++d)
    for (const DevicePlacement& placed : state.packed[d].replicas)
      c.refresh_steps[d] = std::max(c.refresh_steps[d], placed.needed);
  if (state.per_pair()) {
    const std::vector<int> r = c.refresh_steps;
    for (int d = 0; d < D; ++d) c.refresh_steps[d] = std::max(r[d], r[D - 1 - d]);
  }
  if (c.common_cycle) c.refresh_steps.assign(D, *std::max_element(c.refresh_steps.begin(), c.refresh_steps.end()));
  // The shortest cycle asked for: the units stay where they were packed (a leading-gap unit of
  // step R no longer wraps), the steps after them run none.
  for (int& r : c.refresh_steps) r = std::max(r, state.in.min_refresh_steps);
  c.step0 = state.cycle_step0[0].timeline;
  for (const CycleStep0& step0 : state.cycle_step0) c.step0_time = std::max(c.step0_time, step0.timeline.step_time);
  return c;
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
  const CycleStep0& step0 = state.cycle_step0[w];
  const DevicePlacement& placed = state.packed[d].replicas[w];
  const CollectivePin pin = state.pins[d];
  const auto& units = state.packed[d].units.units;
  const int R = state.cycles.refresh_steps[d];
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
  const int at = static_cast<int>((K == 0 ? step0.step.schedule : state.base.timed.schedule).per_device[d].size());
  double t = K == 0 ? step0.timeline.step_time : state.base.timeline.step_time;
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
  const int R = state.cycles.refresh_steps[d];
  // Insert back to front (by position, then start) into each step's list.
  std::stable_sort(e.insertions.begin(), e.insertions.end(), [](const Insertion& a, const Insertion& b) {
    return a.step != b.step ? a.step < b.step : a.at != b.at ? a.at > b.at : a.start > b.start;
  });
  auto& lists = out.cycle[w][d];
  for (int k = 0; k < R; ++k)
    lists.push_back(k == 0 ? state.cycle_step0[w].step.schedule.per_device[d] : state.base.timed.schedule.per_device[d]);
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

EmittedLists emit_lists(const PlanState& state) {
  const int D = state.devices(), W = state.replicas();
  const double base_step_time = state.base.timeline.step_time;
  EmittedLists out;
  PlanLists& lists = out.lists;
  emit_splits_and_placements(state, lists);
  lists.cycle.assign(W, std::vector<std::vector<std::vector<Action>>>(D));
  lists.first_cycle = lists.wrapped_units = lists.cycle;
  out.kfac_work.assign(D, 0);
  out.device_inline.assign(D, 0);
  out.utilization_per_device.assign(D, 0);
  for (int w = 0; w < W; ++w)
    for (int d = 0; d < D; ++d) {
      DeviceEmit e;
      emit_placed_units(state, w, d, e, lists);
      emit_pinned_units(state, w, d, e, lists);
      out.kfac_work[d] = std::max(out.kfac_work[d], e.work);
      out.device_inline[d] = std::max(out.device_inline[d], e.inline_work);
      build_lists(state, w, d, e, lists);
      // Utilization over the device's cycle: F/B/PREC each step plus one cycle of K-FAC work.
      const int R = state.cycles.refresh_steps[d];
      const double time = state.cycles.step0_time + (R - 1) * base_step_time + e.pinned_time;
      const double busy_steps = R * state.base.timeline.busy[d];
      out.utilization_per_device[d] += (busy_steps + e.busy_kfac) / time / W;
    }
  return out;
}

// Bubble, precondition and lower bound per device, mean utilization, and the step time with Chimera's pinned
// units (they lengthen cycle step K: the busiest device's, as a bound). With one cycle for all,
// once per period; with a cycle per pair of twins, each pair's once per its cycle, and the
// pairs' lengthened steps may fall apart: their sum bounds the mean.
Measures measure(const PlanState& state) {
  const int D = state.devices();
  const Timeline& base = state.base.timeline;
  const Cycles& cycles = state.cycles;
  const std::vector<double>& kfac_work = state.emitted.kfac_work;
  const std::vector<double>& utilization = state.emitted.utilization_per_device;
  Measures m;
  m.bubble.assign(D, 0);
  m.precondition.assign(D, 0);
  m.lower_bound_refresh_steps.assign(D, -1);
  for (int d = 0; d < D; ++d) {
    for (const Gap& g : base.gaps(d)) m.bubble[d] += g.end - g.start;
    for (const TimedAction& a : base.per_device[d])
      if (a.action.kind == Kind::PREC) m.precondition[d] += a.end - a.start;
    if (m.bubble[d] > kEps)
      m.lower_bound_refresh_steps[d] = static_cast<int>(std::ceil(kfac_work[d] / m.bubble[d] - 1e-12));
  }
  m.utilization = std::accumulate(utilization.begin(), utilization.end(), 0.0) / D;
  const int P = *std::max_element(cycles.refresh_steps.begin(), cycles.refresh_steps.end());
  double pinned = 0, pinned_per_step = 0;
  std::vector<double> pinned_of(D, 0.0);
  for (const PlacedUnit& u : state.emitted.lists.units)
    if (u.at_step_end)
      pinned_of[u.device] = std::max(pinned_of[u.device], u.end - (u.step == 0 ? cycles.step0_time : base.step_time));
  for (int d = 0; d < D; ++d) {
    pinned = std::max(pinned, pinned_of[d]);
    if (d <= D - 1 - d) pinned_per_step += std::max(pinned_of[d], pinned_of[D - 1 - d]) / cycles.refresh_steps[d];
  }
  m.inline_time = cycles.step0_time - base.step_time + pinned;
  m.step_time = cycles.common_cycle ? (cycles.step0_time + (P - 1) * base.step_time + pinned) / P
                                    : base.step_time + pinned_per_step;
  return m;
}

}  // namespace pf::plan
