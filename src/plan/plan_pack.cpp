// The planner's packing passes (see planner.cpp): Chimera's collectives pinned to the end of a
// cycle step, then every device's gap units packed into the bubbles of consecutive steps by the
// best of several strategies (the paper's greedy first fit first).
#include "core/error.hpp"
#include "plan/plan_state.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace pf::plan {

void Placer::add_step() {
  const int k = steps++;
  if (period > 0 && k >= period) {
    for (size_t i = 0, n = gaps.size(); i < n; ++i)
      if (gaps[i].step == k - period) {
        const double shift = offset(k) - offset(k - period);
        gaps.push_back({{gaps[i].g.start + shift, gaps[i].g.end + shift, gaps[i].g.insert_at, gaps[i].g.leading}, k,
                        gaps[i].phys, 0});
      }
    return;
  }
  for (const Gap& g : (k == 0 ? step0 : base).gaps(d)) {
    if (k == 0 && g.leading && period == 0) continue;  // only the previous cycle's work can run there
    const int self = static_cast<int>(gaps.size());
    gaps.push_back({{g.start + offset(k), g.end + offset(k), g.insert_at, g.leading}, k, self, g.start});
  }
}

void Placer::keep_room(int n_steps, double size, int count, int per_gap) {
  while (steps < n_steps && steps <= max_step) add_step();
  std::vector<int> order;  // physical gaps of those steps, the latest first
  for (int i = static_cast<int>(gaps.size()); i-- > 0;)
    if (gaps[i].phys == i && gaps[i].step < n_steps) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return gaps[a].step > gaps[b].step; });
  for (int round = 0, kept_any = 1; round < per_gap && count > 0 && kept_any; ++round) {
    kept_any = 0;
    for (int i : order)
      if (count > 0 && gaps[i].g.end - gaps[i].g.start + kEps >= gaps[i].kept + size) gaps[i].kept += size, --count, kept_any = 1;
  }
}

std::pair<int, double> Placer::place(double ready, double dur, bool best_fit, bool keep) {
  int found = -1;
  for (size_t i = 0;; ++i) {
    while (i >= gaps.size() && steps <= max_step) {
      PF_CHECK(steps < 10000, "placement does not terminate (unit of {})", dur);
      add_step();
    }
    if (i >= gaps.size()) {
      if (found < 0) return {-1, 0.0};
      break;
    }
    G& g = gaps[i];
    if (found >= 0 && g.step != gaps[found].step) break;
    if (g.step > max_step) {
      if (found < 0) return {-1, 0.0};
      break;
    }
    if (g.g.end <= ready) continue;
    double s0 = std::max(cursor(g), ready);
    if (s0 + dur * (1 + margin) > g.g.end - (keep ? gaps[g.phys].kept : 0.0) + kEps) continue;
    if (found < 0 || g.g.end - s0 < gaps[found].g.end - std::max(cursor(gaps[found]), ready)) found = static_cast<int>(i);
    if (!best_fit) break;
  }
  G& g = gaps[found];
  const double s0 = std::max(cursor(g), ready);
  gaps[g.phys].cursor = s0 + dur - offset(g.step);
  return {found, s0};
}

// Broadcasts keep their chain order (placement order, the same on every replica).
bool Strategy::largest_first(Kind k) const {
  return is_inversion(k) ? inv_largest_first : !is_bcast_inv(k) && curv_largest_first;
}
bool Strategy::best_fit(Kind k) const { return is_inversion(k) ? inv_best_fit : curv_best_fit; }
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

// Strategy::reserve for replica w's units u of device d: room for the largest inversion (with
// margin), for every inversion over half its length, in the steps the work needs at least
// (the period with Chimera's group).
void keep_room_for_inversions(const PlanState& st, const std::vector<Unit>& u, int w, int d, const Strategy& s,
                              Placer& placer) {
  if (s.reserve == 0) return;
  double big = 0, work = 0, bubble = 0;
  for (const Unit& x : u)
    if (!x.inl && !x.pinned && runs_on(x, w)) {
      work += x.dur;
      if (is_inversion(x.a.kind)) big = std::max(big, x.dur * (1 + st.in.margin));
    }
  int count = 0;
  for (const Unit& x : u)
    count += is_inversion(x.a.kind) && !x.inl && !x.pinned && runs_on(x, w) && 2 * x.dur * (1 + st.in.margin) > big;
  for (const Gap& g : st.plan.base.gaps(d)) bubble += g.end - g.start;
  if (big <= kEps || bubble <= kEps) return;
  const int steps = placer.period > 0 ? placer.period : static_cast<int>(std::ceil(work / bubble - 1e-12));
  placer.keep_room(steps, big, s.reserve == 1 ? count : INT_MAX, s.reserve == 1 ? INT_MAX : 1);
}

// Placement order of the units: class by class (CURV_A, CURV_B, BCAST_INV, SYNC, INV_A, INV_B),
// within a class as the strategy says.
std::vector<int> placement_order(const std::vector<Unit>& u, const Strategy& st) {
  std::vector<int> order(u.size());
  std::iota(order.begin(), order.end(), 0);
  auto cls = [&](int i) {
    switch (u[i].a.kind) {
      case Kind::CURV_A: return 0;
      case Kind::CURV_B: return 1;
      case Kind::BCAST_INV_A: case Kind::BCAST_INV_B: return 2;
      case Kind::SYNC_CURV: return 3;
      case Kind::INV_A: return 4;
      default: return 5;
    }
  };
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    if (cls(a) != cls(b)) return cls(a) < cls(b);
    return st.largest_first(u[a].a.kind) && u[a].dur > u[b].dur + kEps;
  });
  return order;
}

bool is_curvature(Kind k) { return k == Kind::CURV_A || k == Kind::CURV_B; }

// Pinned collectives of a device (Chimera): per stage (stage order) its broadcasts (chain
// order), then its sync.
std::vector<int> pinned_collectives(const std::vector<Unit>& u) {
  std::vector<int> syncs;
  for (size_t i = 0; i < u.size(); ++i)
    if (u[i].pinned && is_collective(u[i].a.kind)) syncs.push_back(static_cast<int>(i));
  std::stable_sort(syncs.begin(), syncs.end(), [&](int a, int b) {
    return std::tuple(u[a].a.stage, u[a].a.pipeline, u[a].a.kind == Kind::SYNC_CURV) <
           std::tuple(u[b].a.stage, u[b].a.pipeline, u[b].a.kind == Kind::SYNC_CURV);
  });
  return syncs;
}

// One packing of replica w's units u of device d in progress: the placement and every unit's
// end (inline units and Chimera's pinned collectives known from the start).
struct Packing {
  const PlanState& st;
  int w, d;
  bool curv_only;
  const std::vector<Unit>& u;
  DevicePlacement p;
  std::vector<double> end;
  std::vector<char> done;  // end known

  Packing(const PlanState& s, int w_, int d_, bool curv, int period)
      : st(s), w(w_), d(d_), curv_only(curv), u(s.du[d_].units),
        p{Placer{s.rs[w_].tl0, s.plan.base, d_, s.in.margin, period, period > 0 ? period + s.sync_steps[d_] : INT_MAX, {}, 0},
          std::vector<int>(u.size(), -1), std::vector<double>(u.size(), 0.0), 1},
        end(u.size(), 0.0), done(u.size(), 0) {
    const ReplicaState& r = st.rs[w];
    for (auto [i, idx] : r.inline_at[d]) {
      p.start[i] = r.tl0.per_device[d][idx].start;
      end[i] = r.tl0.per_device[d][idx].end;
      done[i] = 1;
    }
    // Pinned syncs: one after the other from the end of cycle step K; what follows waits for the
    // device's last sync.
    if (st.sync_steps[d] >= 0) {
      double t = p.placer.offset(st.sync_steps[d] + 1);
      const std::vector<int> syncs = pinned_collectives(u);
      for (int i : syncs) t += u[i].dur;
      for (int i : syncs) end[i] = t, done[i] = 1;
    }
  }
  bool placed_here(int i) const {
    return !u[i].inl && !u[i].pinned && runs_on(u[i], w) && (!curv_only || is_curvature(u[i].a.kind));
  }
  double ready(int i) const {
    double t = u[i].ready;
    for (int dep : u[i].deps) t = std::max(t, end[dep]);
    return t;
  }
  void put(int i, int g, double s0) {
    p.gap_of[i] = g;
    p.start[i] = s0;
    end[i] = s0 + u[i].dur;
    done[i] = 1;
  }
};

// Unit by unit in the strategy's order, each into its first (or best) gap.
bool pack_unit_by_unit(Packing& k, const Strategy& strategy) {
  for (int i : placement_order(k.u, strategy)) {
    if (!k.placed_here(i)) continue;
    auto [g, s0] = k.p.placer.place(k.ready(i), k.u[i].dur, strategy.best_fit(k.u[i].a.kind), !is_inversion(k.u[i].a.kind));
    if (g < 0) return false;  // beyond the period's window
    k.put(i, g, s0);
  }
  return true;
}

// Gap by gap in time order: into each, while one fits, the largest unit whose dependencies are
// placed and that is ready at the gap's cursor (else the one that can start first).
bool pack_gap_by_gap(Packing& k, const Strategy& strategy) {
  Placer& pl = k.p.placer;
  std::vector<int> todo;
  for (int i : placement_order(k.u, strategy))
    if (k.placed_here(i)) todo.push_back(i);
  // Chimera: curvature only up to the step whose end has the syncs (the cycle's own).
  const int sync_step = k.st.sync_steps[k.d];
  for (size_t gi = 0; !todo.empty(); ++gi) {
    while (gi >= pl.gaps.size()) {
      if (pl.steps > pl.max_step) return false;
      PF_CHECK(pl.steps < 10000, "placement does not terminate ({} units left)", todo.size());
      pl.add_step();
    }
    const bool curvature_too = sync_step < 0 || pl.gaps[gi].step <= sync_step;
    if (!curvature_too && std::any_of(todo.begin(), todo.end(), [&](int i) { return is_curvature(k.u[i].a.kind); }))
      return false;
    for (;;) {
      const Placer::G& g = pl.gaps[gi];
      const double cursor = pl.cursor(g);
      int best = -1;
      double best_start = 0;
      for (int i : todo) {
        if (!std::all_of(k.u[i].deps.begin(), k.u[i].deps.end(), [&](int x) { return k.done[x] != 0; })) continue;
        const double s0 = std::max(cursor, k.ready(i));
        const double room = g.g.end - (is_inversion(k.u[i].a.kind) ? 0.0 : pl.gaps[g.phys].kept);
        if (s0 + k.u[i].dur * (1 + pl.margin) > room + kEps) continue;
        const bool now = s0 <= cursor + kEps, best_now = best >= 0 && best_start <= cursor + kEps;
        if (best < 0 || (now && !best_now) ||
            (now == best_now && (now ? k.u[i].dur > k.u[best].dur + kEps : s0 < best_start - kEps)))
          best = i, best_start = s0;
      }
      if (best < 0) break;
      pl.gaps[g.phys].cursor = best_start + k.u[best].dur - pl.offset(g.step);
      k.put(best, static_cast<int>(gi), best_start);
      todo.erase(std::find(todo.begin(), todo.end(), best));
    }
  }
  return true;
}

// The steps a complete packing needs. With a period R > 0 (Chimera's group) units may run in the
// next cycle's steps up to its step K (the gaps shared with it): R if everything fits.
int steps_needed(const Packing& k) {
  int last_step = 0, curv_last = 0;
  bool last_leading_only = false;
  for (size_t i = 0; i < k.u.size(); ++i) {
    if (k.p.gap_of[i] < 0) continue;
    const auto& G = k.p.placer.gaps[k.p.gap_of[i]];
    if (is_curvature(k.u[i].a.kind)) curv_last = std::max(curv_last, G.step);
    if (G.step > last_step) {
      last_step = G.step;
      last_leading_only = G.g.leading;
    } else if (G.step == last_step) {
      last_leading_only = last_leading_only && G.g.leading;
    }
  }
  // Units only in the leading gap of the last step wrap into the next cycle's step 0.
  int needed = last_step >= 1 && last_leading_only ? last_step : last_step + 1;
  if (k.curv_only) needed = curv_last;
  // The pinned syncs end cycle step sync_step: the cycle includes it, and curvature must not
  // come later (such a packing is not usable).
  const int sync_step = k.st.sync_steps[k.d];
  if (sync_step >= 0) needed = curv_last > sync_step ? INT_MAX : std::max(needed, sync_step + 1);
  if (k.p.placer.period > 0 && needed != INT_MAX) needed = k.p.placer.period;
  return needed;
}

// Greedy packing of replica w's units of device d with strategy st. Chimera: units that wait for
// a pinned sync start no earlier than the step after sync_steps[d]; curv_only: curvature only
// (to find the sync step, needed = the last step with curvature). With a period R > 0 (Chimera's
// group) units may run in the next cycle's steps up to its step K: needed = R if everything fits,
// else INT_MAX.
DevicePlacement place_device(const PlanState& st, int w, int d, const Strategy& strategy, bool curv_only = false,
                             int period = 0) {
  Packing k(st, w, d, curv_only, period);
  keep_room_for_inversions(st, k.u, w, d, strategy, k.p.placer);
  const bool complete = strategy.gap_first ? pack_gap_by_gap(k, strategy) : pack_unit_by_unit(k, strategy);
  k.p.needed = complete ? steps_needed(k) : INT_MAX;
  return std::move(k.p);
}

// The best strategy for device d (fewest steps over its replicas; replicas of a device use one
// strategy, so their curvature and syncs line up). Returns the steps it needs.
int place_best(const PlanState& st, int d, std::vector<DevicePlacement>& best, std::string& name, int period = 0) {
  int best_r = 0;
  best.clear();
  for (const Strategy& s : strategies()) {
    std::vector<DevicePlacement> cand;
    int r = 0;
    for (int w = 0; w < st.replicas(); ++w) {
      cand.push_back(place_device(st, w, d, s, false, period));
      r = std::max(r, cand.back().needed);
    }
    if (best.empty() || r < best_r) {
      best = std::move(cand);
      best_r = r;
      name = s.name();
    }
  }
  return best_r;
}

}  // namespace

// Chimera: every holder of a stage (twins on devices i and D-1-i, and their replicas) sums its
// curvature at one point, pinned at the end of cycle step K (K = the latest step the twins need
// for their curvature, each with its best curvature packing; with the group per pair of twins,
// else the latest of all devices), in stage order: blocking collectives there cannot deadlock
// (every rank has posted all its sends of the step), where syncs in gaps at different points of
// the twins' lists could.
void pin_collectives(PlanState& st) {
  const int D = st.devices();
  st.sync_steps.assign(D, -1);
  if (!st.chimera()) return;
  std::vector<int> need(D, 0);
  for (int d = 0; d < D; ++d) {
    need[d] = INT_MAX;
    for (const Strategy& s : strategies()) need[d] = std::min(need[d], place_device(st, 0, d, s, true).needed);
  }
  const int K = *std::max_element(need.begin(), need.end());
  for (int d = 0; d < D; ++d) st.sync_steps[d] = st.per_pair() ? std::max(need[d], need[D - 1 - d]) : K;
}

namespace {

// Chimera's group: a pair of twins switches to cycle c's inverses only at cycle c + 1's syncs
// (end of its step K), so cycle c's inversions may run until then, in the gaps of the next
// cycle's steps 0..K that its own curvature leaves free: a shorter cycle R for the same
// freshness of the inverses in use. Per pair, the shortest R (from K + 1) that both twins fit,
// with the earliest sync step K that allows it; else the cycle of the plain placement.
void overlap_pair_cycles(PlanState& st) {
  const int D = st.devices();
  st.period_of.assign(D, 0);
  if (!st.per_pair() || st.any_inline) return;
  for (int d = 0; d < D / 2; ++d) {
    const int e = D - 1 - d;
    std::vector<DevicePlacement> tmp;
    std::string name;
    const int plain = std::max(place_best(st, d, tmp, name), place_best(st, e, tmp, name));
    // A later sync step leaves the curvature more room (and the inversions of the previous
    // cycle more of the shared steps): try K0..R-1 for each R.
    const int K0 = st.sync_steps[d];
    for (int R = K0 + 1; R < plain && st.period_of[d] == 0; ++R)
      for (int K = K0; K < R && st.period_of[d] == 0; ++K) {
        st.sync_steps[d] = st.sync_steps[e] = K;
        if (place_best(st, d, tmp, name, R) == R && place_best(st, e, tmp, name, R) == R) st.period_of[d] = st.period_of[e] = R;
      }
    if (st.period_of[d] == 0) st.sync_steps[d] = st.sync_steps[e] = K0;
  }
}

// Split when it shortens the refresh period: the largest whole inversions of device d, one more
// at a time, into 2 diagonal blocks (then 3, 4), until the device needs fewer steps than best_r;
// the first such set is kept (`splits`, `best`), else none. A block-diagonal factor is cheaper to
// invert (k blocks: 1/k^2 of the work) but approximates the factor (paper appendix A.2).
void split_to_shorten(PlanState& st, int d, int best_r, std::vector<DevicePlacement>& best) {
  std::vector<int> large;  // whole inversions, largest first
  const auto& u = st.du[d].units;
  for (int i = 0; i < static_cast<int>(u.size()); ++i)
    if (is_inversion(u[i].a.kind) && u[i].a.block < 0 && !u[i].inl) large.push_back(i);
  std::stable_sort(large.begin(), large.end(), [&](int a, int b) { return u[a].dur > u[b].dur + kEps; });
  for (int k = 2; k <= 4; ++k) {
    ForcedSplits force;
    for (size_t n = 0; n < large.size(); ++n) {
      const Action& a = st.du[d].units[large[n]].a;
      force[{a.pipeline, a.stage, a.kind == Kind::INV_A ? 0 : 1, a.layer}] = k;
      std::vector<FactorSplit> trial_splits;
      DeviceUnits trial = make_device_units(st.in, st.plan.base, d, st.decide_gap[d], trial_splits, force);
      place_device_inversions(st.in, trial, st.decide_gap[d]);
      std::swap(st.du[d], trial);
      std::vector<DevicePlacement> cand;
      std::string name;
      if (place_best(st, d, cand, name) < best_r) {
        best = std::move(cand);
        st.plan.strategy[d] = name + ", split to shorten the refresh period";
        const auto& stages = st.du[d].stages;
        std::erase_if(st.plan.splits, [&](const FactorSplit& f) {
          return std::find(stages.begin(), stages.end(), std::pair{f.pipeline, f.stage}) != stages.end();
        });
        st.plan.splits.insert(st.plan.splits.end(), trial_splits.begin(), trial_splits.end());
        return;
      }
      std::swap(st.du[d], trial);
    }
  }
}

}  // namespace

// Per device the best strategy (Chimera's group: with the pairs' overlapped cycles), optionally
// split to shorten; each replica keeps its packing (ReplicaState).
void pack_by_strategy(PlanState& st) {
  const int D = st.devices(), W = st.replicas();
  st.plan.strategy.assign(D, "");
  overlap_pair_cycles(st);
  for (int d = 0; d < D; ++d) {
    std::vector<DevicePlacement> best;
    const int best_r = place_best(st, d, best, st.plan.strategy[d], st.period_of[d]);
    if (st.period_of[d] > 0)
      st.plan.strategy[d] += fmt::format(", inversions overlap the next cycle's steps 0-{}", st.sync_steps[d]);
    // Only while every device's cycle is its own (no inline work, one pipeline): the others'
    // plans stay.
    if (st.in.split_to_shorten && !st.any_inline && !st.chimera() && best_r > 1) split_to_shorten(st, d, best_r, best);
    for (int w = 0; w < W; ++w) {
      ReplicaState& r = st.rs[w];
      r.placers.push_back(std::move(best[w].placer));
      r.gap_of.push_back(std::move(best[w].gap_of));
      r.start.push_back(std::move(best[w].start));
      r.needed.push_back(best[w].needed);
    }
  }
}

}  // namespace pf::plan
