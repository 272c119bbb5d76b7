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
void set_cycle_lengths(PlanState& st) {
  KfacPlan& plan = st.plan;
  const int D = st.devices();
  plan.common_cycle = st.any_inline || (st.chimera() && !st.per_pair());
  plan.sync_steps = st.sync_steps;
  plan.sync_step = *std::max_element(st.sync_steps.begin(), st.sync_steps.end());
  plan.refresh_steps.assign(D, 1);
  for (int d = 0; d < D; ++d)
    for (const ReplicaState& r : st.rs) plan.refresh_steps[d] = std::max(plan.refresh_steps[d], r.needed[d]);
  if (st.per_pair()) {
    const std::vector<int> r = plan.refresh_steps;
    for (int d = 0; d < D; ++d) plan.refresh_steps[d] = std::max(r[d], r[D - 1 - d]);
  }
  if (plan.common_cycle) plan.refresh_steps.assign(D, *std::max_element(plan.refresh_steps.begin(), plan.refresh_steps.end()));
  plan.step0 = st.rs[0].tl0;
  plan.step0_time = 0;
  for (const ReplicaState& r : st.rs) plan.step0_time = std::max(plan.step0_time, r.tl0.step_time);
  plan.inline_time = plan.step0_time - plan.base_step_time;
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
  std::vector<Insertion> ins;
  double work = 0, inl = 0, busy_kfac = 0, pinned_time = 0;
};

// Inline units (cycle step 0, timed in its schedule) and gap units (where the packing put them).
void emit_placed_units(PlanState& st, int w, int d, DeviceEmit& e) {
  KfacPlan& plan = st.plan;
  const ReplicaState& r = st.rs[w];
  const auto& u = st.du[d].units;
  const int R = plan.refresh_steps[d];
  for (auto [i, idx] : r.inline_at[d]) {
    const TimedAction& t = r.tl0.per_device[d][idx];
    plan.units.push_back({u[i].a, w, d, 0, t.start, t.end, true, false});
    e.inl += u[i].dur;
  }
  for (size_t i = 0; i < u.size(); ++i) {
    if (!runs_on(u[i], w)) continue;
    e.work += u[i].dur;
    if (is_compute(u[i].a.kind)) e.busy_kfac += u[i].dur;
    if (r.gap_of[d][i] < 0) continue;
    const auto& G = r.placers[d].gaps[r.gap_of[d][i]];
    // Wrapped: in the next cycle's step G.step - R (its leading gap of step 0, or with a period
    // up to its step K), listed in this cycle step from the second cycle on.
    const bool wrapped = G.step >= R;
    PF_CHECK(G.step < R || (st.period_of[d] > 0 ? G.step <= R + st.sync_steps[d] : G.step == R && G.g.leading),
             "unit beyond its cycle");
    const int step = wrapped ? G.step - R : G.step;
    const double start = r.start[d][i] - r.placers[d].offset(G.step);
    e.ins.push_back({step, G.g.insert_at, start, static_cast<int>(i), wrapped});
    plan.units.push_back({u[i].a, w, d, step, start, start + u[i].dur, false, wrapped});
  }
}

// Pinned units (Chimera): after everything of cycle step K, per stage (stage order) its
// broadcasts (chain order) and its sync; then the inversions that could not go into any gap.
void emit_pinned_units(PlanState& st, int w, int d, DeviceEmit& e) {
  KfacPlan& plan = st.plan;
  const ReplicaState& r = st.rs[w];
  const auto& u = st.du[d].units;
  std::vector<int> pinned;
  for (size_t i = 0; i < u.size(); ++i)
    if (u[i].pinned && runs_on(u[i], w)) pinned.push_back(static_cast<int>(i));
  std::stable_sort(pinned.begin(), pinned.end(), [&](int a, int b) {
    const bool ia = !is_collective(u[a].a.kind), ib = !is_collective(u[b].a.kind);
    return std::tuple(ia, u[a].a.stage, u[a].a.pipeline, u[a].a.kind == Kind::SYNC_CURV) <
           std::tuple(ib, u[b].a.stage, u[b].a.pipeline, u[b].a.kind == Kind::SYNC_CURV);
  });
  const int K = st.sync_steps[d];
  const int at = static_cast<int>((K == 0 ? r.step0.s : st.base.s).per_device[d].size());
  double t = K == 0 ? r.tl0.step_time : plan.base.step_time;
  for (int i : pinned) {
    e.ins.push_back({K, at, t, i, false});
    PlacedUnit pu{u[i].a, w, d, K, t, t + u[i].dur, true, false};
    pu.at_step_end = true;
    plan.units.push_back(pu);
    t += u[i].dur;
    e.inl += u[i].dur;
    e.pinned_time += u[i].dur;
  }
}

// The lists of cycle steps 0..R-1 (steady state, and the first cycle without wrapped units),
// the wrapped units per step, and the optimizer steps at the end of every list.
void build_lists(PlanState& st, int w, int d, DeviceEmit& e) {
  KfacPlan& plan = st.plan;
  const ReplicaState& r = st.rs[w];
  const auto& u = st.du[d].units;
  const int R = plan.refresh_steps[d];
  // Insert back to front (by position, then start) into each step's list.
  std::stable_sort(e.ins.begin(), e.ins.end(), [](const Insertion& a, const Insertion& b) {
    return a.step != b.step ? a.step < b.step : a.at != b.at ? a.at > b.at : a.start > b.start;
  });
  auto& cyc = plan.cycle[w][d];
  for (int k = 0; k < R; ++k) cyc.push_back(k == 0 ? r.step0.s.per_device[d] : st.base.s.per_device[d]);
  // Inline syncs were timed as PREC; give them back their kind.
  for (auto [i, idx] : r.inline_at[d]) cyc[0][idx] = u[i].a;
  for (const Insertion& x : e.ins) cyc[x.step].insert(cyc[x.step].begin() + x.at, u[x.unit].a);
  for (int k = 0; k < R; ++k) {
    std::vector<Action> wrapped_actions, list, wrapped_in_order;
    for (const Insertion& x : e.ins)
      if (x.wrapped && x.step == k) wrapped_actions.push_back(u[x.unit].a);
    for (const Action& a : cyc[k]) {
      auto it = std::find(wrapped_actions.begin(), wrapped_actions.end(), a);
      if (it != wrapped_actions.end()) wrapped_actions.erase(it), wrapped_in_order.push_back(a);
      else list.push_back(a);
    }
    plan.first_cycle[w][d].push_back(std::move(list));
    plan.wrapped_units[w][d].push_back(std::move(wrapped_in_order));
  }
  const auto& opt = st.optimizer[d];
  for (auto* lists : {&plan.cycle[w][d], &plan.first_cycle[w][d]})
    for (auto& list : *lists) list.insert(list.end(), opt.begin(), opt.end());
  plan.first[w][d] = plan.first_cycle[w][d][0];
}

}  // namespace

void emit_lists(PlanState& st) {
  KfacPlan& plan = st.plan;
  const int D = st.devices(), W = st.replicas();
  plan.cycle.assign(W, std::vector<std::vector<std::vector<Action>>>(D));
  plan.first.assign(W, std::vector<std::vector<Action>>(D));
  plan.first_cycle.assign(W, std::vector<std::vector<std::vector<Action>>>(D));
  plan.wrapped_units.assign(W, std::vector<std::vector<std::vector<Action>>>(D));
  plan.kfac_work.assign(D, 0);
  plan.device_inline.assign(D, 0);
  plan.utilization_per_device.assign(D, 0);
  for (int w = 0; w < W; ++w)
    for (int d = 0; d < D; ++d) {
      DeviceEmit e;
      emit_placed_units(st, w, d, e);
      emit_pinned_units(st, w, d, e);
      plan.kfac_work[d] = std::max(plan.kfac_work[d], e.work);
      plan.device_inline[d] = std::max(plan.device_inline[d], e.inl);
      build_lists(st, w, d, e);
      // Utilization over the device's cycle: F/B/PREC each step plus one cycle of K-FAC work.
      const int R = plan.refresh_steps[d];
      const double time = plan.step0_time + (R - 1) * plan.base_step_time + e.pinned_time;
      const double busy_steps = R * plan.base.busy[d];
      plan.utilization_per_device[d] += (busy_steps + e.busy_kfac) / time / W;
    }
}

// Bubble, precondition and lower bound per device, mean utilization, and the step time with Chimera's pinned
// units (they lengthen cycle step K: the busiest device's, as a bound). With one cycle for all,
// once per period; with a cycle per pair of twins, each pair's once per its cycle, and the
// pairs' lengthened steps may fall apart: their sum bounds the mean.
void measure(PlanState& st) {
  KfacPlan& plan = st.plan;
  const int D = st.devices();
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
  for (const PlacedUnit& u : plan.units)
    if (u.at_step_end)
      pinned_of[u.device] = std::max(pinned_of[u.device], u.end - (u.step == 0 ? plan.step0_time : plan.base_step_time));
  for (int d = 0; d < D; ++d) {
    pinned = std::max(pinned, pinned_of[d]);
    if (d <= D - 1 - d) pinned_per_step += std::max(pinned_of[d], pinned_of[D - 1 - d]) / plan.refresh_steps[d];
  }
  plan.inline_time += pinned;
  plan.step_time = plan.common_cycle ? (plan.step0_time + (P - 1) * plan.base_step_time + pinned) / P
                                     : plan.base_step_time + pinned_per_step;
}

}  // namespace pf::plan
