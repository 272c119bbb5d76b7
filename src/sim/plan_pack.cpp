// The planner's packing passes (see planner.cpp): Chimera's collectives pinned to the end of a
// cycle step, then every device's gap units packed into the bubbles of consecutive steps by the
// best of several strategies (the paper's greedy first fit first).
#include "core/error.hpp"
#include "sim/plan_state.hpp"

#include <algorithm>
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

std::pair<int, double> Placer::place(double ready, double dur, bool best_fit) {
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
    if (s0 + dur * (1 + margin) > g.g.end + kEps) continue;
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
  auto part = [](bool largest, bool best) {
    return std::string(largest ? "largest-first " : "ready-order ") + (best ? "best-fit" : "first-fit");
  };
  return "curvature " + part(curv_largest_first, curv_best_fit) + ", inversion " + part(inv_largest_first, inv_best_fit);
}

namespace {

// All 16 combinations, the paper's (ready order, first fit) first. The one needing the fewest
// steps wins (the earlier on a tie). Deterministic.
std::vector<Strategy> strategies() {
  std::vector<Strategy> out;
  for (int i = 0; i < 16; ++i) out.push_back({(i & 1) != 0, (i & 2) != 0, (i & 4) != 0, (i & 8) != 0});
  return out;
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

// Greedy packing of replica w's units of device d with strategy st. Chimera: units that wait for
// a pinned sync start no earlier than the step after sync_steps[d]; curv_only: curvature only
// (to find the sync step, needed = the last step with curvature). With a period R > 0 (Chimera's
// group) units may run in the next cycle's steps up to its step K (the gaps shared with it):
// needed = R if everything fits, else INT_MAX.
DevicePlacement place_device(const PlanState& st, int w, int d, const Strategy& strategy, bool curv_only = false,
                             int period = 0) {
  const ReplicaState& r = st.rs[w];
  const auto& u = st.du[d].units;
  const int sync_step = st.sync_steps[d];
  DevicePlacement p{Placer{r.tl0, st.plan.base, d, st.in.margin, period, period > 0 ? period + sync_step : INT_MAX, {}, 0},
                    std::vector<int>(u.size(), -1), std::vector<double>(u.size(), 0.0), 1};
  std::vector<double> end(u.size(), 0.0);
  for (auto [i, idx] : r.inline_at[d]) {
    p.start[i] = r.tl0.per_device[d][idx].start;
    end[i] = r.tl0.per_device[d][idx].end;
  }
  // Pinned syncs: one after the other from the end of cycle step K; what follows waits for the
  // device's last sync.
  if (sync_step >= 0) {
    double t = p.placer.offset(sync_step + 1);
    const std::vector<int> syncs = pinned_collectives(u);
    for (int i : syncs) t += u[i].dur;
    for (int i : syncs) end[i] = t;
  }
  int last_step = 0, curv_last = 0;
  bool last_leading_only = false;
  for (int i : placement_order(u, strategy)) {
    if (u[i].inl || u[i].pinned || !runs_on(u[i], w)) continue;
    const bool curv = is_curvature(u[i].a.kind);
    if (curv_only && !curv) continue;
    double ready = u[i].ready;
    for (int dep : u[i].deps) ready = std::max(ready, end[dep]);
    auto [g, s0] = p.placer.place(ready, u[i].dur, strategy.best_fit(u[i].a.kind));
    if (g < 0) {  // beyond the period's window
      p.needed = INT_MAX;
      return p;
    }
    p.gap_of[i] = g;
    p.start[i] = s0;
    end[i] = s0 + u[i].dur;
    const auto& G = p.placer.gaps[g];
    if (curv) curv_last = std::max(curv_last, G.step);
    if (G.step > last_step) {
      last_step = G.step;
      last_leading_only = G.g.leading;
    } else if (G.step == last_step) {
      last_leading_only = last_leading_only && G.g.leading;
    }
  }
  // Units only in the leading gap of the last step wrap into the next cycle's step 0.
  p.needed = last_step >= 1 && last_leading_only ? last_step : last_step + 1;
  if (curv_only) p.needed = curv_last;
  // The pinned syncs end cycle step sync_step: the cycle includes it, and curvature must not
  // come later (such a packing is not usable).
  if (sync_step >= 0) p.needed = curv_last > sync_step ? INT_MAX : std::max(p.needed, sync_step + 1);
  if (period > 0 && p.needed != INT_MAX) p.needed = period;
  return p;
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
