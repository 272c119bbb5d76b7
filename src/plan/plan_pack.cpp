// The planner's packing passes (see planner.cpp): Chimera's collectives pinned to the end of a
// cycle step, then every device's gap units packed into the bubbles of consecutive steps by the
// best of several strategies (the paper's greedy first fit first), through the Placer (plan_placer.cpp).
#include "core/error.hpp"
#include "plan/plan_state.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <tuple>

namespace pf::plan {

// Broadcasts keep their chain order (placement order, the same on every replica).
bool Strategy::largest_first(Kind k) const {
  return is_factor_refresh(k) ? inv_largest_first : !is_bcast_inv(k) && curv_largest_first;
}
bool Strategy::best_fit(Kind k) const { return is_factor_refresh(k) ? inv_best_fit : curv_best_fit; }
std::string Strategy::name() const {
  if (gap_first) return std::string("gap by gap, the largest unit that fits") + (reserve ? ", room kept for the largest inversions" : "");
  auto part = [](bool largest, bool best) {
    return std::string(largest ? "largest-first " : "ready-order ") + (best ? "best-fit" : "first-fit");
  };
  return "curvature " + part(curv_largest_first, curv_best_fit) + ", inversion " + part(inv_largest_first, inv_best_fit) +
         (reserve == 1 ? ", room kept for the largest inversions" : reserve == 2 ? ", room kept for one in every gap" : "");
}

namespace {

// All 48 combinations of the unit-by-unit packing, the paper's (ready order, first fit, no room
// kept) first, then gap by gap with and without room kept. The one needing the fewest steps wins
// (the earlier on a tie). Deterministic.
std::vector<Strategy> strategies() {
  std::vector<Strategy> out;
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 16; ++i) out.push_back({(i & 1) != 0, (i & 2) != 0, (i & 4) != 0, (i & 8) != 0, r});
  for (int r = 0; r < 2; ++r) out.push_back({false, false, false, false, r, true});
  return out;
}

// A unit the gaps take (not inline, not pinned) that replica w runs.
bool gap_unit(const Unit& unit, int replica) { return !unit.runs_inline && !unit.pinned && runs_on(unit, replica); }

// Strategy::reserve for replica w's units of device d: room for the largest inversion (with
// margin), for every inversion over half its length, in the steps the work needs at least
// (the period with Chimera's group).
void keep_room_for_inversions(const PlanState& state, const std::vector<Unit>& units, int replica, int device,
                              const Strategy& strategy, Placer& placer) {
  if (strategy.reserve == 0) return;
  const Fit fit = gap_fit(state.in);
  double big = 0, work = 0, bubble = 0;
  for (const Unit& unit : units)
    if (gap_unit(unit, replica)) {
      work += unit.duration;
      if (is_factor_refresh(unit.action.kind)) big = std::max(big, fit.padded(unit.duration));
    }
  int count = 0;
  for (const Unit& unit : units)
    count += is_factor_refresh(unit.action.kind) && gap_unit(unit, replica) && fit.padded(2 * unit.duration) > big;
  for (const Gap& g : state.base.timeline.gaps(device)) bubble += g.end - g.start;
  if (big <= kEps || bubble <= kEps) return;
  const int steps = placer.period > 0 ? placer.period : static_cast<int>(std::ceil(work / bubble - 1e-12));
  const bool each = strategy.reserve == 1;
  placer.keep_room(steps, big, each ? count : INT_MAX, each ? INT_MAX : 1);
}

// Placement order of the units: class by class (CURV_A, CURV_B, BCAST_INV, SYNC, INV_A or EIG_L,
// INV_B or EIG_R),
// within a class as the strategy says.
std::vector<int> placement_order(const std::vector<Unit>& units, const Strategy& strategy) {
  std::vector<int> order(units.size());
  std::iota(order.begin(), order.end(), 0);
  auto placement_class = [&](int i) {
    switch (units[i].action.kind) {
      case Kind::CURV_A: return 0;
      case Kind::CURV_B: return 1;
      case Kind::BCAST_INV_A: case Kind::BCAST_INV_B: return 2;
      case Kind::SYNC_CURV: return 3;
      case Kind::INV_A: case Kind::EIG_L: return 4;  // SOAP's refreshes as K-FAC's inversions
      default: return 5;
    }
  };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    if (placement_class(a) != placement_class(b)) return placement_class(a) < placement_class(b);
    return strategy.largest_first(units[a].action.kind) && units[a].duration > units[b].duration + kEps;
  });
  return order;
}

// Pinned collectives of a device (Chimera): per stage (stage order) its broadcasts (chain
// order), then its sync.
std::vector<int> pinned_collectives(const std::vector<Unit>& units) {
  std::vector<int> syncs;
  for (size_t i = 0; i < units.size(); ++i)
    if (units[i].pinned && is_collective(units[i].action.kind)) syncs.push_back(static_cast<int>(i));
  auto key = [&](int i) {
    const Action& a = units[i].action;
    return std::tuple(a.stage, a.pipeline, a.kind == Kind::SYNC_CURV);
  };
  std::stable_sort(syncs.begin(), syncs.end(), [&](int a, int b) { return key(a) < key(b); });
  return syncs;
}

// One packing of replica w's units of device d in progress: the placement and every unit's
// end (inline units and Chimera's pinned collectives known from the start).
struct Packing {
  const std::vector<Unit>& units;
  int replica, device;
  CollectivePin pin;
  bool curv_only;
  DevicePlacement result;
  std::vector<double> end;
  std::vector<char> done;  // end known

  Packing(const PlanState& state, const std::vector<Unit>& device_units, int w, int d, CollectivePin p, bool curv)
      : units(device_units), replica(w), device(d), pin(p), curv_only(curv),
        result{Placer{.step0 = state.cycle_step0[w].timeline,
                      .base = state.base.timeline,
                      .device = d,
                      .fit = gap_fit(state.in),
                      .period = p.period,
                      .max_step = p.period > 0 ? p.period + p.sync_step : INT_MAX},
               std::vector<int>(units.size(), -1), std::vector<double>(units.size(), 0.0), 1},
        end(units.size(), 0.0), done(units.size(), 0) {
    const CycleStep0& step0 = state.cycle_step0[w];
    for (auto [i, index] : step0.inline_at[d]) {
      result.start[i] = step0.timeline.per_device[d][index].start;
      end[i] = step0.timeline.per_device[d][index].end;
      done[i] = 1;
    }
    // Pinned syncs: one after the other from the end of cycle step K; what follows waits for the
    // device's last sync.
    if (pin.sync_step >= 0) {
      double t = result.placer.offset(pin.sync_step + 1);
      const std::vector<int> syncs = pinned_collectives(units);
      for (int i : syncs) t += units[i].duration;
      for (int i : syncs) end[i] = t, done[i] = 1;
    }
  }
  bool placed_here(int i) const { return gap_unit(units[i], replica) && (!curv_only || is_curvature(units[i].action.kind)); }
  double ready(int i) const {
    double t = units[i].ready;
    for (int dep : units[i].deps) t = std::max(t, end[dep]);
    return t;
  }
  bool deps_done(int i) const {
    return std::all_of(units[i].deps.begin(), units[i].deps.end(), [&](int x) { return done[x] != 0; });
  }
  void put(int i, int gap, double start) {
    result.gap_of[i] = gap;
    result.start[i] = start;
    end[i] = start + units[i].duration;
    done[i] = 1;
  }
};

// Unit by unit in the strategy's order, each into its first (or best) gap.
bool pack_unit_by_unit(Packing& packing, const Strategy& strategy) {
  for (int i : placement_order(packing.units, strategy)) {
    if (!packing.placed_here(i)) continue;
    const Unit& unit = packing.units[i];
    const Kind kind = unit.action.kind;
    auto [gap, start] = packing.result.placer.place(packing.ready(i), unit.duration, strategy.best_fit(kind), !is_factor_refresh(kind));
    if (gap < 0) return false;  // beyond the period's window
    packing.put(i, gap, start);
  }
  return true;
}

// Into gap `gap_index`, while one fits, the largest of `todo` whose dependencies are placed and
// that is ready at the gap's cursor (else the one that can start first).
void fill_gap(Packing& packing, int gap_index, std::vector<int>& todo) {
  Placer& placer = packing.result.placer;
  const auto& units = packing.units;
  for (;;) {
    const Placer::StepGap& g = placer.gaps[gap_index];
    const double cursor = placer.cursor(g);
    int best = -1;
    double best_start = 0;
    for (int i : todo) {
      if (!packing.deps_done(i)) continue;
      const double start = std::max(cursor, packing.ready(i));
      const double room = g.gap.end - (is_factor_refresh(units[i].action.kind) ? 0.0 : placer.gaps[g.cursor_gap].kept);
      if (!placer.fit.holds(start, units[i].duration, room)) continue;
      const bool now = start <= cursor + kEps, best_now = best >= 0 && best_start <= cursor + kEps;
      if (best < 0 || (now && !best_now) ||
          (now == best_now && (now ? units[i].duration > units[best].duration + kEps : start < best_start - kEps)))
        best = i, best_start = start;
    }
    if (best < 0) return;
    placer.gaps[g.cursor_gap].cursor = best_start + units[best].duration - placer.offset(g.step);
    packing.put(best, gap_index, best_start);
    todo.erase(std::find(todo.begin(), todo.end(), best));
  }
}

// Gap by gap in time order, each filled by fill_gap.
bool pack_gap_by_gap(Packing& packing, const Strategy& strategy) {
  Placer& placer = packing.result.placer;
  std::vector<int> todo;
  for (int i : placement_order(packing.units, strategy))
    if (packing.placed_here(i)) todo.push_back(i);
  // Chimera: curvature only up to the step whose end has the syncs (the cycle's own).
  const int sync_step = packing.pin.sync_step;
  for (size_t gi = 0; !todo.empty(); ++gi) {
    while (gi >= placer.gaps.size()) {
      if (placer.steps > placer.max_step) return false;
      PF_CHECK(placer.steps < 10000, "placement does not terminate ({} units left)", todo.size());
      placer.add_step();
    }
    const bool curvature_too = sync_step < 0 || placer.gaps[gi].step <= sync_step;
    if (!curvature_too &&
        std::any_of(todo.begin(), todo.end(), [&](int i) { return is_curvature(packing.units[i].action.kind); }))
      return false;
    fill_gap(packing, static_cast<int>(gi), todo);
  }
  return true;
}

// The steps a complete packing needs. With a period R > 0 (Chimera's group) units may run in the
// next cycle's steps up to its step K (the gaps shared with it): R if everything fits.
int steps_needed(const Packing& packing) {
  int last_step = 0, curv_last = 0;
  bool last_leading_only = false;
  for (size_t i = 0; i < packing.units.size(); ++i) {
    if (packing.result.gap_of[i] < 0) continue;
    const Placer::StepGap& g = packing.result.placer.gaps[packing.result.gap_of[i]];
    if (is_curvature(packing.units[i].action.kind)) curv_last = std::max(curv_last, g.step);
    if (g.step > last_step) {
      last_step = g.step;
      last_leading_only = g.gap.leading;
    } else if (g.step == last_step) {
      last_leading_only = last_leading_only && g.gap.leading;
    }
  }
  // Units only in the leading gap of the last step wrap into the next cycle's step 0.
  int needed = last_step >= 1 && last_leading_only ? last_step : last_step + 1;
  if (packing.curv_only) needed = curv_last;
  // The pinned syncs end cycle step sync_step: the cycle includes it, and curvature must not
  // come later (such a packing is not usable).
  const int sync_step = packing.pin.sync_step;
  if (sync_step >= 0) needed = curv_last > sync_step ? INT_MAX : std::max(needed, sync_step + 1);
  if (packing.pin.period > 0 && needed != INT_MAX) needed = packing.pin.period;
  return needed;
}

// Greedy packing of replica w's units of device d with a strategy. Chimera: units that wait for
// a pinned sync start no earlier than the step after pin.sync_step; curv_only: curvature only
// (to find the sync step, needed = the last step with curvature). With a period R > 0 (Chimera's
// group) units may run in the next cycle's steps up to its step K: needed = R if everything fits,
// else INT_MAX.
DevicePlacement place_device(const PlanState& state, const std::vector<Unit>& units, int replica, int device,
                             const Strategy& strategy, CollectivePin pin, bool curv_only = false) {
  Packing packing(state, units, replica, device, pin, curv_only);
  keep_room_for_inversions(state, units, replica, device, strategy, packing.result.placer);
  const bool complete = strategy.gap_first ? pack_gap_by_gap(packing, strategy) : pack_unit_by_unit(packing, strategy);
  packing.result.needed = complete ? steps_needed(packing) : INT_MAX;
  return std::move(packing.result);
}

// The best strategy for a device's units (fewest steps over its replicas; replicas of a device
// use one strategy, so their curvature and syncs line up).
struct BestPacking {
  std::vector<DevicePlacement> replicas;  // [replica]
  int needed = 0;
  std::string strategy;
};
BestPacking place_best(const PlanState& state, const std::vector<Unit>& units, int device, CollectivePin pin) {
  BestPacking best;
  for (const Strategy& strategy : strategies()) {
    std::vector<DevicePlacement> candidate;
    int needed = 0;
    for (int w = 0; w < state.replicas(); ++w) {
      candidate.push_back(place_device(state, units, w, device, strategy, pin));
      needed = std::max(needed, candidate.back().needed);
    }
    if (best.replicas.empty() || needed < best.needed) best = {std::move(candidate), needed, strategy.name()};
  }
  return best;
}

int steps_needed_by_best(const PlanState& state, int device, CollectivePin pin) {
  return place_best(state, state.device_units[device].units, device, pin).needed;
}

// Chimera's group: a pair of twins switches to cycle c's inverses only at cycle c + 1's syncs
// (end of its step K), so cycle c's inversions may run until then, in the gaps of the next
// cycle's steps 0..K that its own curvature leaves free: a shorter cycle R for the same
// freshness of the inverses in use. For the pair (device, twin) synced at K0: the shortest R
// (from K0 + 1) that both twins fit, with the earliest sync step K that allows it; else K0 and
// the cycle of the plain placement.
CollectivePin overlapped_pin(const PlanState& state, int device, int twin, int K0) {
  const int plain = std::max(steps_needed_by_best(state, device, {K0, 0}), steps_needed_by_best(state, twin, {K0, 0}));
  // A later sync step leaves the curvature more room (and the inversions of the previous
  // cycle more of the shared steps): try K0..R-1 for each R.
  for (int R = K0 + 1; R < plain; ++R)
    for (int K = K0; K < R; ++K)
      if (steps_needed_by_best(state, device, {K, R}) == R && steps_needed_by_best(state, twin, {K, R}) == R)
        return {K, R};
  return {K0, 0};
}

}  // namespace

// Chimera: every holder of a stage (twins on devices i and D-1-i, and their replicas) sums its
// curvature at one point, pinned at the end of cycle step K (K = the latest step the twins need
// for their curvature, each with its best curvature packing; with the group per pair of twins,
// else the latest of all devices), in stage order: blocking collectives there cannot deadlock
// (every rank has posted all its sends of the step), where syncs in gaps at different points of
// the twins' lists could. With the group, each pair's overlapped cycle (overlapped_pin).
std::vector<CollectivePin> pin_collectives(const PlanState& state) {
  const int D = state.devices();
  std::vector<CollectivePin> pins(D);
  if (!state.chimera() || state.in.work == BubbleWork::soap) return pins;  // SOAP has no collectives
  std::vector<int> need(D, INT_MAX);
  for (int d = 0; d < D; ++d)
    for (const Strategy& s : strategies())
      need[d] = std::min(need[d], place_device(state, state.device_units[d].units, 0, d, s, {}, true).needed);
  const int K = *std::max_element(need.begin(), need.end());
  for (int d = 0; d < D; ++d) pins[d].sync_step = state.per_pair() ? std::max(need[d], need[D - 1 - d]) : K;
  if (!state.per_pair() || state.any_inline()) return pins;
  for (int d = 0; d < D / 2; ++d) pins[d] = pins[D - 1 - d] = overlapped_pin(state, d, D - 1 - d, pins[d].sync_step);
  return pins;
}

namespace {

// Split when it shortens the refresh period: the largest whole inversions of the device, one
// more at a time, into 2 diagonal blocks (then 3, 4), until the device needs fewer steps than
// `needed`; the first such set is kept (`packed`, its strategy named), else none. A block-diagonal factor
// is cheaper to invert (k blocks: 1/k^2 of the work) but approximates the factor (paper
// appendix A.2).
void split_to_shorten(const PlanState& state, int device, int needed, PackedDevice& packed) {
  const auto& units = state.device_units[device].units;
  std::vector<int> large;  // whole inversions, largest first
  for (int i = 0; i < static_cast<int>(units.size()); ++i)
    if (is_inversion(units[i].action.kind) && units[i].action.block < 0 && !units[i].runs_inline) large.push_back(i);
  std::stable_sort(large.begin(), large.end(), [&](int a, int b) { return units[a].duration > units[b].duration + kEps; });
  for (int k = 2; k <= 4; ++k) {
    ForcedSplits force;
    for (int i : large) {
      const Action& a = units[i].action;
      force[{a.pipeline, a.stage, side_index(a.kind), a.layer}] = k;
      DeviceUnits trial = device_units(state.in, state.base.timeline, device, state.base.largest_shared_gap[device], force);
      BestPacking best = place_best(state, trial.units, device, state.pins[device]);
      if (best.needed < needed) {
        packed = {std::move(trial), std::move(best.replicas), true, best.strategy + ", split to shorten the refresh period"};
        return;
      }
    }
  }
}

// A unit of a packed device.
struct DeviceUnit {
  int device, unit;
};

// SOAP under Chimera: each factor's refresh units, one per pipeline's copy of its stage (on the
// twins holding that stage), grouped; inline units as well (they run in cycle step 0 on both).
std::vector<std::vector<DeviceUnit>> refresh_copies(const std::vector<PackedDevice>& packed) {
  std::map<std::tuple<Kind, int, int, int>, std::vector<DeviceUnit>> copies;  // (kind, stage, layer, block)
  for (size_t d = 0; d < packed.size(); ++d) {
    const std::vector<Unit>& units = packed[d].units.units;
    for (size_t i = 0; i < units.size(); ++i) {
      const Action& a = units[i].action;
      if (is_eigenbasis(a.kind)) copies[{a.kind, a.stage, a.layer, a.block}].push_back({static_cast<int>(d), static_cast<int>(i)});
    }
  }
  std::vector<std::vector<DeviceUnit>> out;
  for (auto& [factor, units] : copies)
    if (units.size() > 1) out.push_back(std::move(units));
  return out;
}

// The cycle step a replica's packing runs unit i in: its gap's, 0 when inline.
int cycle_step_of(const DevicePlacement& placed, int i) {
  return placed.gap_of[i] >= 0 ? placed.placer.gaps[placed.gap_of[i]].step : 0;
}

// One round of aligning refresh copies: every copy (on every replica) that runs before the
// latest waits for the start of the latest's step (its ready raised). The devices whose units
// changed.
std::vector<char> raise_to_latest_copy(const std::vector<std::vector<DeviceUnit>>& groups, std::vector<PackedDevice>& packed) {
  std::vector<char> changed(packed.size(), 0);
  for (const std::vector<DeviceUnit>& copies : groups) {
    int latest = 0;
    for (const DeviceUnit& u : copies)
      for (const DevicePlacement& placed : packed[u.device].replicas)
        latest = std::max(latest, cycle_step_of(placed, u.unit));
    for (const DeviceUnit& u : copies) {
      PackedDevice& p = packed[u.device];
      Unit& unit = p.units.units[u.unit];
      double start = 0;
      bool early = false;
      for (const DevicePlacement& placed : p.replicas) {
        start = std::max(start, placed.placer.offset(latest));
        early = early || cycle_step_of(placed, u.unit) < latest;
      }
      if (!early) continue;
      PF_CHECK(!unit.runs_inline && start > unit.ready + kEps, "SOAP's {} cannot wait for its twin's step {}",
               to_token(unit.action), latest);
      unit.ready = start;
      changed[u.device] = 1;
    }
  }
  return changed;
}

// SOAP under Chimera: the twins (devices d and D-1-d, each holding the other's copy of its two
// stages) keep equal optimizer states only if each factor refreshes in the same cycle step on
// both (what a refresh computes depends on its step alone: a step's deferred statistics are added
// by whichever of STAT and the refresh runs first). The twins share their cycle length
// (set_cycle_lengths), so the same packed step is the same executed step. Each round raises the
// earlier copies to the latest's step and packs their devices again. Readies only rise, but that
// alone does not bound the rounds: a cap (never reached in the tests) fails loudly rather than loop.
void align_twin_refreshes(const PlanState& state, std::vector<PackedDevice>& packed) {
  const std::vector<std::vector<DeviceUnit>> groups = refresh_copies(packed);
  for (int round = 0;; ++round) {
    const std::vector<char> changed = raise_to_latest_copy(groups, packed);
    if (std::none_of(changed.begin(), changed.end(), [](char c) { return c != 0; })) return;
    PF_CHECK(round < 10000, "SOAP's twin refreshes do not settle in one cycle step");
    for (int d = 0; d < state.devices(); ++d)
      if (changed[d]) {
        BestPacking best = place_best(state, packed[d].units.units, d, state.pins[d]);
        packed[d].replicas = std::move(best.replicas);
        packed[d].strategy = best.strategy + ", each refresh in its twin's cycle step";
      }
  }
}

}  // namespace

// Per device the best strategy (Chimera's group: with the pairs' overlapped cycles), optionally
// split to shorten; each replica keeps its packing. SOAP under Chimera: the twins' refreshes
// aligned (align_twin_refreshes).
std::vector<PackedDevice> pack_by_strategy(const PlanState& state) {
  std::vector<PackedDevice> out;
  for (int d = 0; d < state.devices(); ++d) {
    const CollectivePin pin = state.pins[d];
    BestPacking best = place_best(state, state.device_units[d].units, d, pin);
    PackedDevice packed{state.device_units[d], std::move(best.replicas), false, best.strategy};
    if (pin.period > 0) packed.strategy += fmt::format(", inversions overlap the next cycle's steps 0-{}", pin.sync_step);
    // Only while every device's cycle is its own (no inline work, one pipeline): the others'
    // plans stay.
    if (state.in.split_to_shorten && !state.any_inline() && !state.chimera() && best.needed > 1)
      split_to_shorten(state, d, best.needed, packed);
    out.push_back(std::move(packed));
  }
  if (state.in.work == BubbleWork::soap && state.chimera()) align_twin_refreshes(state, out);
  return out;
}

}  // namespace pf::plan
