// The PipeFisher planner (see planner.hpp for the rules): precondition placement, the K-FAC
// work units of each device, splits and inline decisions, greedy first-fit into the gaps of
// consecutive steps, and the per-step action lists.
#include "sim/planner.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <numeric>
#include <tuple>

namespace pf {

namespace {

constexpr double kEps = 1e-9;
constexpr double kMinCollective = 1e-6;  // shortest broadcast unit (time units of the input)
constexpr int kNoReplica = -2;           // a unit owned by another holder of its stage (Chimera group)

// Chimera's group: the holders of a stage are its two pipeline copies x W replicas (else W).
bool chimera_group(const PlanInput& in) { return in.chimera_group && in.schedule.pipelines > 1; }
int group_size(const PlanInput& in) { return (chimera_group(in) ? in.schedule.pipelines : 1) * in.replicas; }

// An idle interval of one device in one step. `insert_at`: where an action running in it goes
// in the device's list (after the occupying action before the gap and the sends it started).
struct StepGap {
  double start = 0, end = 0;
  int insert_at = 0;
  bool leading = false;  // before the device's first occupying action of the step
};

// Occupying = anything but point-to-point (a receive is a wait: idle; a collective keeps the
// device in the collective).
std::vector<StepGap> find_gaps(const Timeline& tl, int d) {
  std::vector<StepGap> out;
  const auto& row = tl.per_device[d];
  double t = 0;
  int insert = 0;
  bool leading = true;
  for (size_t i = 0; i < row.size(); ++i) {
    if (is_p2p(row[i].action.kind)) continue;
    if (row[i].start > t + kEps) out.push_back({t, row[i].start, insert, leading});
    t = std::max(t, row[i].end);
    leading = false;
    insert = static_cast<int>(i) + 1;
    while (insert < static_cast<int>(row.size()) &&
           (row[insert].action.kind == Kind::SEND_F || row[insert].action.kind == Kind::SEND_B))
      ++insert;
  }
  if (tl.step_time > t + kEps) out.push_back({t, tl.step_time, static_cast<int>(row.size()), leading});
  return out;
}

const StageKfacCost& stage_cost(const PlanInput& in, int s) {
  return in.kfac.size() == 1 ? in.kfac[0] : in.kfac[s];
}

double base_duration(const PlanInput& in, int d, size_t i) {
  return in.durations.empty() ? in.cost.duration(in.schedule.per_device[d][i]) : in.durations[d][i];
}

// A schedule with per-action durations, edited by inserting actions.
struct TimedSchedule {
  Schedule s;
  std::vector<std::vector<double>> dur;
  void insert(int d, int at, const Action& a, double t) {
    s.per_device[d].insert(s.per_device[d].begin() + at, a);
    dur[d].insert(dur[d].begin() + at, t);
  }
  Timeline simulate() const { return pf::simulate(s, CostModel{}, &dur); }
};

bool is_final_backward(Kind k) { return k == Kind::B || k == Kind::W; }

// PREC(p,s) for each hosted stage: in the first gap after the stage's last backward (and
// ALLREDUCE) where it fits with margin, else before the stage's OPT, else at the device's end.
TimedSchedule with_precondition(const PlanInput& in) {
  TimedSchedule ts{in.schedule, {}};
  for (int d = 0; d < in.schedule.devices; ++d) {
    ts.dur.emplace_back();
    for (size_t i = 0; i < in.schedule.per_device[d].size(); ++i) ts.dur[d].push_back(base_duration(in, d, i));
  }
  const Timeline tl = ts.simulate();
  for (int d = 0; d < in.schedule.devices; ++d) {
    struct Prec {
      int p, s;
      double ready;
      int after;  // index of its last dependency
    };
    std::map<std::pair<int, int>, Prec> stages;
    const auto& row = tl.per_device[d];
    for (size_t i = 0; i < row.size(); ++i) {
      const Action& a = row[i].action;
      if (!is_final_backward(a.kind) && a.kind != Kind::ALLREDUCE) continue;
      Prec& p = stages.try_emplace({a.pipeline, a.stage}, Prec{a.pipeline, a.stage, 0, -1}).first->second;
      p.ready = std::max(p.ready, row[i].end);
      p.after = static_cast<int>(i);
    }
    std::vector<Prec> order;
    for (auto& [k, p] : stages) order.push_back(p);
    std::stable_sort(order.begin(), order.end(), [](const Prec& a, const Prec& b) { return a.ready < b.ready; });
    std::vector<StepGap> gaps = find_gaps(tl, d);
    std::vector<std::pair<int, Prec>> inserts;  // (position in the original list, what)
    for (const Prec& p : order) {
      const double t = stage_cost(in, p.s).precondition;
      int at = -1;
      for (StepGap& g : gaps) {
        double s0 = std::max(g.start, p.ready);
        if (g.insert_at > p.after && s0 + t * (1 + in.margin) <= g.end + kEps) {
          at = g.insert_at;
          g.start = s0 + t;
          break;
        }
      }
      if (at < 0) {
        at = static_cast<int>(row.size());
        for (size_t i = 0; i < row.size(); ++i)
          if (row[i].action.kind == Kind::OPT && row[i].action.pipeline == p.p && row[i].action.stage == p.s)
            at = static_cast<int>(i);
      }
      inserts.push_back({at, p});
    }
    // Insert back to front; equal positions keep their readiness order.
    for (size_t k = inserts.size(); k-- > 0;)
      ts.insert(d, inserts[k].first, Action{Kind::PREC, inserts[k].second.s, inserts[k].second.p, -1, -1},
                stage_cost(in, inserts[k].second.s).precondition);
  }
  return ts;
}

// One K-FAC unit of a device, before placement.
struct Unit {
  Action a;
  double dur = 0;
  double ready = 0;        // from the step's own F/B (curvature), 0 otherwise
  std::vector<int> deps;   // earlier units of the device
  int owner = -1;          // replica running it (-1 = every replica, kNoReplica: another device)
  bool inl = false;
  bool pinned = false;     // Chimera: at the end of cycle step K (syncs, then inline inversions)
};

struct DeviceUnits {
  int device = 0;
  std::vector<Unit> units;
  std::vector<std::pair<int, int>> stages;  // hosted (pipeline, stage), by first forward
  std::vector<StagePlacement> placements;   // W > 1 (place_inversions)
};

// The units of device d in priority order: CURV_A, CURV_B, SYNC, INV_A, INV_B.
// force: (pipeline, stage, side, layer) -> blocks for inversions that would run whole (the
// "split when it shortens the refresh period" policy below).
using ForcedSplits = std::map<std::tuple<int, int, int, int>, int>;
DeviceUnits make_units(const PlanInput& in, const Timeline& step, int d, double max_gap,
                       std::vector<FactorSplit>& splits, const ForcedSplits& force = {}) {
  DeviceUnits du;
  du.device = d;
  auto& u = du.units;
  const auto& row = step.per_device[d];
  std::map<std::pair<int, int>, std::vector<int>> curv_of_stage;
  std::map<std::tuple<int, int, int, int>, std::vector<int>> curv_of_factor;  // (p, s, side, layer)
  for (const TimedAction& t : row)
    if (t.action.kind == Kind::F &&
        std::find(du.stages.begin(), du.stages.end(), std::pair{t.action.pipeline, t.action.stage}) == du.stages.end())
      du.stages.push_back({t.action.pipeline, t.action.stage});
  for (int side = 0; side < 2; ++side)
    for (const TimedAction& t : row) {
      const Action& a = t.action;
      const bool backward = a.kind == Kind::B || a.kind == Kind::I;
      const bool src = side == 0 && !in.recompute ? a.kind == Kind::F : backward;
      if (!src) continue;
      const StageKfacCost& c = stage_cost(in, a.stage);
      for (int l = 0; l < c.layers(); ++l) {
        Unit x;
        x.a = Action{side == 0 ? Kind::CURV_A : Kind::CURV_B, a.stage, a.pipeline, a.micro_batch, l};
        x.dur = side == 0 ? c.curv_a[l] : c.curv_b[l];
        x.ready = t.end;
        curv_of_stage[{a.pipeline, a.stage}].push_back(static_cast<int>(u.size()));
        curv_of_factor[{a.pipeline, a.stage, side, l}].push_back(static_cast<int>(u.size()));
        u.push_back(x);
      }
    }
  std::map<std::pair<int, int>, int> sync_of;
  const bool chimera = in.schedule.pipelines > 1;
  if (in.replicas > 1 || chimera)
    for (auto [p, s] : du.stages) {
      Unit x;
      x.a = Action{Kind::SYNC_CURV, s, p, -1, -1};
      // Never zero (as a broadcast, below): list order breaks ties in start time by start only.
      x.dur = std::max(stage_cost(in, s).sync, kMinCollective);
      x.deps = curv_of_stage[{p, s}];
      x.pinned = chimera;
      sync_of[{p, s}] = static_cast<int>(u.size());
      u.push_back(x);
    }
  for (int side = 0; side < 2; ++side)
    for (auto [p, s] : du.stages) {
      const StageKfacCost& c = stage_cost(in, s);
      const Kind kind = side == 0 ? Kind::INV_A : Kind::INV_B;
      for (int l = 0; l < c.layers(); ++l) {
        const double whole = side == 0 ? c.inv_a[l] : c.inv_b[l];
        const int dim = side == 0 ? c.dim_a[l] : c.dim_b[l];
        std::vector<int> deps = curv_of_factor[{p, s, side, l}];
        if (sync_of.count({p, s})) deps.push_back(sync_of[{p, s}]);
        int k = 1;
        if (max_gap <= kEps) {
          k = 0;  // no gap at all: inline
        } else if (whole * (1 + in.margin) > max_gap + kEps) {  // larger than every gap: split if a split fits
          k = 0;
          for (int t = 2; t <= dim && k == 0; ++t)
            if (block_cost(whole, dim, t, 0) * (1 + in.margin) <= max_gap + kEps) k = t;
        }
        // A factor of dimension d has at most d diagonal blocks (BERT's NSP head: B is 2 x 2).
        if (k == 1 && force.count({p, s, side, l})) k = std::min(force.at({p, s, side, l}), dim);
        if (k > 1) {
          FactorSplit f{p, s, l, kind, k, whole, 0};
          for (int j = 0; j < k; ++j) {
            Unit x;
            x.a = Action{kind, s, p, -1, l, j};
            x.dur = block_cost(whole, dim, k, j);
            f.pieces += x.dur;
            x.deps = deps;
            u.push_back(x);
          }
          splits.push_back(f);
          continue;
        }
        Unit x;
        x.a = Action{kind, s, p, -1, l};
        x.dur = whole;
        x.deps = deps;
        x.inl = k == 0;  // even a single row would not fit
        u.push_back(x);
      }
    }
  // Curvature and sync larger than every gap run inline; an inline unit's dependencies run
  // inline before it (they must precede it in cycle step 0). Walk back to front: deps come first.
  for (Unit& x : u)
    if (!x.pinned && (max_gap <= kEps || x.dur * (1 + in.margin) > max_gap + kEps)) x.inl = true;
  for (size_t i = u.size(); i-- > 0;)
    if (u[i].inl)
      for (int dep : u[i].deps)
        if (!u[dep].pinned) u[dep].inl = true;
  // Chimera: an inversion that must run inline waits for its (pinned) sync: it runs right after
  // it, at the end of cycle step K, on the critical path.
  if (chimera)
    for (Unit& x : u)
      if (x.inl && (x.a.kind == Kind::INV_A || x.a.kind == Kind::INV_B)) x.inl = false, x.pinned = true;
  return du;
}

// Broadcast of one inverse piece of size n: alpha + beta * bytes (4-byte floats: the upper
// triangle, or the n entries of a diagonal factor).
double bcast_time(const PlanInput& in, int64_t n, bool diagonal) {
  const double floats = diagonal ? static_cast<double>(n) : static_cast<double>(n) * (n + 1) / 2;
  return in.bcast_alpha + in.bcast_beta * 4 * floats;
}

// The holders of a stage (W replicas; with Chimera's group also both pipeline copies, member
// p * W + w) share its inversions by SPD-KFAC's Algorithm 1 (kfac/placement.hpp) over its pieces:
// NCT pieces run on every holder, CT pieces on their owner, each CT followed by a BCAST_INV unit
// on every holder (the previous cycle's inverse, before the stage's SYNC_CURV: chained in
// placement order, the sync after the last). Inline and pinned as the sync is. Every holder
// computes the same placement (same pieces: holders split alike, see plan_kfac).
void place_inversions(const PlanInput& in, DeviceUnits& du, double max_gap) {
  const int W = in.replicas, G = group_size(in);
  du.placements.clear();
  if (G <= 1) return;
  auto& u = du.units;
  const bool chimera = in.schedule.pipelines > 1;
  for (auto [p, s] : du.stages) {
    const StageKfacCost& c = stage_cost(in, s);
    StagePlacement sp;
    sp.pipeline = p, sp.stage = s;
    for (int m = 0; m < G; ++m) {
      const int q = G == W ? p : m / W;  // the member's pipeline copy
      sp.members.push_back({in.schedule.device_of(q, s), m % W});
    }
    std::vector<int> idx;  // [piece] unit index
    int sync = -1;
    for (int i = 0; i < static_cast<int>(u.size()); ++i) {
      const Action& a = u[i].a;
      if (a.pipeline != p || a.stage != s) continue;
      if (a.kind == Kind::SYNC_CURV) sync = i;
      if (a.kind != Kind::INV_A && a.kind != Kind::INV_B) continue;
      const bool is_a = a.kind == Kind::INV_A;
      const int d = is_a ? c.dim_a[a.layer] : c.dim_b[a.layer];
      int64_t n = d;
      if (a.block >= 0) {  // sizes as kfac's split_blocks: the first d % k blocks get one more row
        int k = 0;
        for (const Unit& x : u) k += x.a.kind == a.kind && x.a.pipeline == p && x.a.stage == s && x.a.layer == a.layer;
        n = d / k + (a.block < d % k ? 1 : 0);
      }
      const bool diag = !is_a && !c.diag_b.empty() && c.diag_b[a.layer] != 0;
      idx.push_back(i);
      sp.pieces.push_back(a);
      sp.dims.push_back(n);
      sp.inv_time.push_back(u[i].dur);
      sp.bcast_time.push_back(bcast_time(in, n, diag));
    }
    PF_CHECK(sync >= 0, "no SYNC_CURV for stage {} of pipeline {}", s, p);
    sp.placement = place_load_balanced(sp.dims, G, sp.inv_time, sp.bcast_time);
    std::vector<int> chain;  // the stage's broadcasts, in placement order
    for (int k : sp.placement.order) {
      const int m = sp.placement.owner[k];
      // The replica of this device that inverts the piece: every one (NCT), its owner, or none
      // (the owner is the other pipeline's copy).
      u[idx[k]].owner = m == kEveryRank ? kEveryRank : sp.members[m].first == du.device ? sp.members[m].second : kNoReplica;
      if (m == kEveryRank) continue;
      const Action& inv = u[idx[k]].a;
      Unit b;
      b.a = Action{inv.kind == Kind::INV_A ? Kind::BCAST_INV_A : Kind::BCAST_INV_B, s, p, -1, inv.layer, inv.block};
      // Never zero: a zero-length unit would tie in start time with the next one, and list
      // order breaks ties by start only.
      b.dur = std::max(sp.bcast_time[k], kMinCollective);
      if (!chain.empty()) b.deps.push_back(chain.back());
      b.pinned = chimera;
      b.inl = !chimera && (max_gap <= kEps || b.dur * (1 + in.margin) > max_gap + kEps);
      chain.push_back(static_cast<int>(u.size()));
      u.push_back(b);
    }
    if (!chain.empty()) u[sync].deps.push_back(chain.back());
    // An inline sync needs its broadcasts inline before it; an inline broadcast the earlier ones.
    for (size_t j = chain.size(); j-- > 0;)
      if (!chimera && (u[sync].inl || (j + 1 < chain.size() && u[chain[j + 1]].inl))) u[chain[j]].inl = true;
    du.placements.push_back(std::move(sp));
  }
}

bool runs_on(const Unit& x, int w) { return x.owner == kEveryRank || x.owner == w; }

// Cycle step 0 of replica w: the step with PREC plus the inline units, each stage's just before
// its PREC. Returns the schedule and, per inline unit, its index in the device list.
TimedSchedule with_inline(const TimedSchedule& base, const std::vector<DeviceUnits>& du, int w,
                          std::vector<std::vector<std::pair<int, int>>>& where) {
  TimedSchedule ts = base;
  where.assign(du.size(), {});
  for (size_t d = 0; d < du.size(); ++d) {
    // Unit order, but a stage's broadcasts right before its sync (they chain into it).
    const auto& units = du[d].units;
    std::vector<size_t> order;
    for (size_t i = 0; i < units.size(); ++i) {
      if (is_bcast_inv(units[i].a.kind)) continue;
      if (units[i].a.kind == Kind::SYNC_CURV)
        for (size_t j = 0; j < units.size(); ++j)
          if (is_bcast_inv(units[j].a.kind) && units[j].a.stage == units[i].a.stage &&
              units[j].a.pipeline == units[i].a.pipeline)
            order.push_back(j);
      order.push_back(i);
    }
    for (size_t i : order) {
      const Unit& x = units[i];
      if (!x.inl || x.pinned || !runs_on(x, w)) continue;
      auto& list = ts.s.per_device[d];
      int at = static_cast<int>(list.size());
      for (size_t j = 0; j < list.size(); ++j)
        if (list[j].kind == Kind::PREC && list[j].pipeline == x.a.pipeline && list[j].stage == x.a.stage)
          at = static_cast<int>(j);
      // The simulator groups collectives of equal (kind, stage) across devices (Chimera twins);
      // a replica-local sync is timed as plain device work.
      Action timed = x.a;
      if (is_collective(timed.kind)) timed.kind = Kind::PREC;
      ts.insert(static_cast<int>(d), at, timed, x.dur);
      for (auto& [unit, idx] : where[d])
        if (idx >= at) ++idx;
      where[d].push_back({static_cast<int>(i), at});
    }
  }
  return ts;
}

// Greedy first fit of one replica's gap units over consecutive steps. Absolute times from the
// cycle start: step 0 from `step0`, step k >= 1 from `base` shifted. With a period R > 0 (Chimera's
// group, see plan_kfac) steps k >= R are the next cycle's steps k - R: their gaps are the same
// gaps (one cursor, kept relative to the step), step 0's leading gap included, and nothing goes
// beyond step max_step (place returns gap -1).
struct Placer {
  const Timeline& step0;
  const Timeline& base;
  int d;
  double margin;
  int period = 0, max_step = INT_MAX;
  struct G {
    StepGap g;
    int step;
    int phys;       // the gap whose cursor this one shares (itself unless an alias)
    double cursor;  // relative to its step's start (physical gaps only)
  };
  std::vector<G> gaps;
  int steps = 0;

  double offset(int k) const { return k == 0 ? 0 : step0.step_time + (k - 1) * base.step_time; }
  void add_step() {
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
    for (const StepGap& g : find_gaps(k == 0 ? step0 : base, d)) {
      if (k == 0 && g.leading && period == 0) continue;  // only the previous cycle's work can run there
      const int self = static_cast<int>(gaps.size());
      gaps.push_back({{g.start + offset(k), g.end + offset(k), g.insert_at, g.leading}, k, self, g.start});
    }
  }
  double cursor(const G& g) const { return gaps[g.phys].cursor + offset(g.step); }
  // Returns (gap index, absolute start), or (-1, 0) past max_step. First fit: the earliest gap
  // that takes the unit; best fit: in the earliest step that has such a gap, the one left with
  // the least room.
  std::pair<int, double> place(double ready, double dur, bool best_fit) {
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
};

// Packings tried per device, the paper's first: priority classes always in order (CURV_A,
// CURV_B, SYNC, INV_A, INV_B); within a class by readiness or largest first, and first or best
// fit, chosen separately for curvature (and sync) and for inversion. The one needing the fewest
// steps wins (the earlier on a tie). Deterministic.
struct Strategy {
  bool curv_largest_first, curv_best_fit;  // curvature and sync
  bool inv_largest_first, inv_best_fit;    // inversion
  // Broadcasts keep their chain order (placement order, the same on every replica).
  bool largest_first(Kind k) const { return is_inv(k) ? inv_largest_first : !is_bcast_inv(k) && curv_largest_first; }
  bool best_fit(Kind k) const { return is_inv(k) ? inv_best_fit : curv_best_fit; }
  static bool is_inv(Kind k) { return k == Kind::INV_A || k == Kind::INV_B; }
  std::string name() const {
    auto part = [](bool largest, bool best) {
      return std::string(largest ? "largest-first " : "ready-order ") + (best ? "best-fit" : "first-fit");
    };
    return "curvature " + part(curv_largest_first, curv_best_fit) + ", inversion " + part(inv_largest_first, inv_best_fit);
  }
};
// All 16 combinations, the paper's (ready order, first fit) first.
std::vector<Strategy> strategies() {
  std::vector<Strategy> out;
  for (int i = 0; i < 16; ++i) out.push_back({(i & 1) != 0, (i & 2) != 0, (i & 4) != 0, (i & 8) != 0});
  return out;
}

// Placement order of the units: class by class, within a class as the strategy says.
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

}  // namespace

int StagePlacement::owner_of(const Action& a) const {
  const Kind inv = a.kind == Kind::BCAST_INV_A ? Kind::INV_A : a.kind == Kind::BCAST_INV_B ? Kind::INV_B : a.kind;
  for (size_t k = 0; k < pieces.size(); ++k)
    if (pieces[k] == Action{inv, a.stage, a.pipeline, -1, a.layer, a.block}) return placement.owner[k];
  PF_CHECK(false, "{} is no inversion piece of stage {} pipeline {}", to_token(a), stage, pipeline);
  return kEveryRank;
}

KfacPlan plan_kfac(const PlanInput& in) {
  const Schedule& sch = in.schedule;
  if (in.replicas < 1) usage_error("--data-parallel", "must be >= 1 (got {})", in.replicas);
  if (in.margin < 0) usage_error("--margin", "must be >= 0 (got {})", in.margin);
  if (in.bcast_alpha < 0 || in.bcast_beta < 0)
    usage_error(in.bcast_alpha < 0 ? "--bcast-alpha" : "--bcast-beta", "must be >= 0 (got {})",
                in.bcast_alpha < 0 ? in.bcast_alpha : in.bcast_beta);
  if (in.kfac.empty() || (in.kfac.size() != 1 && static_cast<int>(in.kfac.size()) != sch.stages))
    usage_error("--kfac", "K-FAC costs for {} stages but the schedule has {}", in.kfac.size(), sch.stages);
  for (const StageKfacCost& c : in.kfac)
    if (c.layers() < 1 || c.curv_b.size() != c.curv_a.size() || c.inv_a.size() != c.curv_a.size() ||
        c.inv_b.size() != c.curv_a.size() || c.dim_a.size() != c.curv_a.size() || c.dim_b.size() != c.curv_a.size() ||
        (!c.diag_b.empty() && c.diag_b.size() != c.curv_a.size()))
      usage_error("--kfac", "every stage needs curvature, inversion and sizes for each of its layers");
  if (!in.durations.empty()) {
    bool ok = static_cast<int>(in.durations.size()) == sch.devices;
    for (int d = 0; ok && d < sch.devices; ++d) ok = in.durations[d].size() == sch.per_device[d].size();
    if (!ok) usage_error("--profile", "measured durations do not have the shape of the schedule");
  }
  for (const auto& row : sch.per_device)
    for (const Action& a : row)
      if (is_kfac(a.kind))
        usage_error("--schedule-file", "the schedule already has K-FAC action {}; the planner adds them", to_token(a));

  KfacPlan plan;
  plan.devices = sch.devices;
  plan.replicas = in.replicas;
  plan.step_template = sch;
  const int D = sch.devices, W = in.replicas;

  const TimedSchedule base = with_precondition(in);
  plan.base = base.simulate();
  plan.base_step_time = plan.base.step_time;

  std::vector<double> max_gap(D, 0.0);
  for (int d = 0; d < D; ++d)
    for (const StepGap& g : find_gaps(plan.base, d)) max_gap[d] = std::max(max_gap[d], g.end - g.start);
  // Every holder of a stage must split its factors alike (Chimera's twins: same weights, same
  // preconditioning): the split and inline decisions use the smallest largest gap among the
  // devices hosting any of the device's stages.
  std::vector<double> decide_gap = max_gap;
  for (int d = 0; d < D; ++d)
    for (int e = 0; e < D; ++e)
      for (int p = 0; p < sch.pipelines; ++p)
        for (int q = 0; q < sch.pipelines; ++q)
          for (int st = 0; st < sch.stages; ++st)
            if (sch.device_of(p, st) == d && sch.device_of(q, st) == e) decide_gap[d] = std::min(decide_gap[d], max_gap[e]);
  std::vector<DeviceUnits> du(D);
  for (int d = 0; d < D; ++d) {
    du[d] = make_units(in, plan.base, d, decide_gap[d], plan.splits);
    place_inversions(in, du[d], decide_gap[d]);
  }

  // Per replica: cycle step 0 (with inline work) and the gap placement.
  struct ReplicaState {
    TimedSchedule step0;
    Timeline tl0;
    std::vector<std::vector<std::pair<int, int>>> inline_at;  // [device] (unit, index)
    std::vector<std::vector<int>> gap_of;                     // [device][unit] gap index or -1
    std::vector<std::vector<double>> start;                   // [device][unit] absolute start
    std::vector<Placer> placers;
    std::vector<int> needed;                                  // [device] steps needed
  };
  std::vector<ReplicaState> rs;
  bool any_inline = false;
  for (int w = 0; w < W; ++w) {
    ReplicaState r;
    r.step0 = with_inline(base, du, w, r.inline_at);
    r.tl0 = r.step0.simulate();
    rs.push_back(std::move(r));
  }
  struct DevicePlacement {
    Placer placer;
    std::vector<int> gap_of;
    std::vector<double> start;
    int needed = 1;
  };
  // Chimera: the K-FAC units of cycle step >= sync_step[d] + 1 that wait for a pinned sync start
  // no earlier than that step; curv_only: place curvature only (to find the sync step).
  std::vector<int> sync_steps(D, -1);
  // period R > 0 (Chimera's group): units may run in the next cycle's steps up to its step K
  // (the gaps shared with it), needed = R if everything fits, else INT_MAX.
  auto place_device = [&](int w, int d, const Strategy& st, bool curv_only = false, int period = 0) {
    const ReplicaState& r = rs[w];
    const auto& u = du[d].units;
    const int sync_step = sync_steps[d];
    DevicePlacement p{Placer{r.tl0, plan.base, d, in.margin, period, period > 0 ? period + sync_step : INT_MAX, {}, 0},
                      std::vector<int>(u.size(), -1), std::vector<double>(u.size(), 0.0), 1};
    std::vector<double> end(u.size(), 0.0);
    for (auto [i, idx] : r.inline_at[d]) {
      p.start[i] = r.tl0.per_device[d][idx].start;
      end[i] = r.tl0.per_device[d][idx].end;
    }
    // Pinned syncs: one after the other from the end of cycle step K (stage order).
    if (sync_step >= 0) {
      double t = p.placer.offset(sync_step + 1);
      std::vector<int> syncs;
      for (size_t i = 0; i < u.size(); ++i)
        if (u[i].pinned && is_collective(u[i].a.kind)) syncs.push_back(static_cast<int>(i));
      std::stable_sort(syncs.begin(), syncs.end(), [&](int a, int b) {
        return std::tuple(u[a].a.stage, u[a].a.pipeline, u[a].a.kind == Kind::SYNC_CURV) <
               std::tuple(u[b].a.stage, u[b].a.pipeline, u[b].a.kind == Kind::SYNC_CURV);
      });
      for (int i : syncs) t += u[i].dur;
      for (int i : syncs) end[i] = t;  // what follows waits for the device's last sync
    }
    int last_step = 0, curv_last = 0;
    bool last_leading_only = false;
    for (int i : placement_order(u, st)) {
      if (u[i].inl || u[i].pinned || !runs_on(u[i], w)) continue;
      const bool curv = u[i].a.kind == Kind::CURV_A || u[i].a.kind == Kind::CURV_B;
      if (curv_only && !curv) continue;
      double ready = u[i].ready;
      for (int dep : u[i].deps) ready = std::max(ready, end[dep]);
      auto [g, s0] = p.placer.place(ready, u[i].dur, st.best_fit(u[i].a.kind));
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
    p.needed = last_step >= 1 && last_leading_only ? last_step : last_step + 1;
    if (curv_only) p.needed = curv_last;
    // The pinned syncs end cycle step sync_step: the cycle includes it, and curvature must not
    // come later (such a packing is not usable).
    if (sync_step >= 0) p.needed = curv_last > sync_step ? INT_MAX : std::max(p.needed, sync_step + 1);
    if (period > 0 && p.needed != INT_MAX) p.needed = period;
    return p;
  };
  // Chimera: every holder of a stage (twins on devices i and D-1-i, and their replicas) sums its
  // curvature at one point, pinned at the end of cycle step K (K = the latest step the twins need
  // for their curvature, each with its best curvature packing; with the group per pair of twins,
  // else the latest of all devices), in stage order: blocking collectives there cannot deadlock
  // (every rank has posted all its sends of the step), where syncs in gaps at different points of
  // the twins' lists could.
  const bool per_pair = chimera_group(in);
  if (sch.pipelines > 1) {
    std::vector<int> need(D, 0);
    for (int d = 0; d < D; ++d) {
      need[d] = INT_MAX;
      for (const Strategy& st : strategies()) need[d] = std::min(need[d], place_device(0, d, st, true).needed);
    }
    const int K = *std::max_element(need.begin(), need.end());
    for (int d = 0; d < D; ++d) sync_steps[d] = per_pair ? std::max(need[d], need[D - 1 - d]) : K;
  }
  plan.strategy.assign(D, "");
  for (int d = 0; d < D; ++d)
    for (int w = 0; w < W; ++w)
      if (!rs[w].inline_at[d].empty()) any_inline = true;
  // Replicas of a device use one strategy, so their curvature and syncs line up.
  auto place_best = [&](int d, std::vector<DevicePlacement>& best, std::string& name, int period = 0) {
    int best_r = 0;
    best.clear();
    for (const Strategy& st : strategies()) {
      std::vector<DevicePlacement> cand;
      int r = 0;
      for (int w = 0; w < W; ++w) {
        cand.push_back(place_device(w, d, st, false, period));
        r = std::max(r, cand.back().needed);
      }
      if (best.empty() || r < best_r) {
        best = std::move(cand);
        best_r = r;
        name = st.name();
      }
    }
    return best_r;
  };
  // Chimera's group: a pair of twins switches to cycle c's inverses only at cycle c + 1's syncs
  // (end of its step K), so cycle c's inversions may run until then, in the gaps of the next
  // cycle's steps 0..K that its own curvature leaves free: a shorter cycle R for the same
  // freshness of the inverses in use. Per pair, the shortest R (from K + 1) that both twins fit,
  // with the earliest sync step K that allows it; else the cycle of the plain placement.
  std::vector<int> period_of(D, 0);
  if (per_pair && !any_inline)
    for (int d = 0; d < D / 2; ++d) {
      const int e = D - 1 - d;
      std::vector<DevicePlacement> tmp;
      std::string name;
      const int plain = std::max(place_best(d, tmp, name), place_best(e, tmp, name));
      // A later sync step leaves the curvature more room (and the inversions of the previous
      // cycle more of the shared steps): try K0..R-1 for each R.
      const int K0 = sync_steps[d];
      for (int R = K0 + 1; R < plain && period_of[d] == 0; ++R)
        for (int K = K0; K < R && period_of[d] == 0; ++K) {
          sync_steps[d] = sync_steps[e] = K;
          if (place_best(d, tmp, name, R) == R && place_best(e, tmp, name, R) == R) period_of[d] = period_of[e] = R;
        }
      if (period_of[d] == 0) sync_steps[d] = sync_steps[e] = K0;
    }
  for (int d = 0; d < D; ++d) {
    std::vector<DevicePlacement> best;
    const int best_r = place_best(d, best, plan.strategy[d], period_of[d]);
    if (period_of[d] > 0) plan.strategy[d] += fmt::format(", inversions overlap the next cycle's steps 0-{}", sync_steps[d]);
    // Split when it shortens the refresh period: the largest whole inversions of the device, one
    // more at a time, into 2 diagonal blocks (then 3, 4), until the device needs fewer steps; the
    // first such set is kept (`splits`), else none. A block-diagonal factor is cheaper to invert
    // (k blocks: 1/k^2 of the work) but approximates the factor (paper appendix A.2). Only while
    // every device's cycle is its own (no inline work, one pipeline): the others' plans stay.
    if (in.split_to_shorten && !any_inline && sch.pipelines == 1 && best_r > 1) {
      std::vector<int> large;  // whole inversions, largest first
      const auto& u = du[d].units;
      for (int i = 0; i < static_cast<int>(u.size()); ++i)
        if ((u[i].a.kind == Kind::INV_A || u[i].a.kind == Kind::INV_B) && u[i].a.block < 0 && !u[i].inl)
          large.push_back(i);
      std::stable_sort(large.begin(), large.end(), [&](int a, int b) { return u[a].dur > u[b].dur + kEps; });
      bool done = false;
      for (int k = 2; k <= 4 && !done; ++k) {
        ForcedSplits force;
        for (size_t n = 0; n < large.size() && !done; ++n) {
          const Action& a = du[d].units[large[n]].a;
          force[{a.pipeline, a.stage, a.kind == Kind::INV_A ? 0 : 1, a.layer}] = k;
          std::vector<FactorSplit> trial_splits;
          DeviceUnits trial = make_units(in, plan.base, d, decide_gap[d], trial_splits, force);
          place_inversions(in, trial, decide_gap[d]);
          std::swap(du[d], trial);
          std::vector<DevicePlacement> cand;
          std::string name;
          if (place_best(d, cand, name) < best_r) {
            done = true;
            best = std::move(cand);
            plan.strategy[d] = name + ", split to shorten the refresh period";
            std::erase_if(plan.splits, [&](const FactorSplit& f) {
              return std::find(du[d].stages.begin(), du[d].stages.end(), std::pair{f.pipeline, f.stage}) != du[d].stages.end();
            });
            plan.splits.insert(plan.splits.end(), trial_splits.begin(), trial_splits.end());
          } else {
            std::swap(du[d], trial);
          }
        }
      }
    }
    for (int w = 0; w < W; ++w) {
      rs[w].placers.push_back(std::move(best[w].placer));
      rs[w].gap_of.push_back(std::move(best[w].gap_of));
      rs[w].start.push_back(std::move(best[w].start));
      rs[w].needed.push_back(best[w].needed);
    }
  }

  for (int d = 0; d < D; ++d)
    for (StagePlacement& sp : du[d].placements) {
      sp.device = d;
      plan.placements.push_back(sp);
    }

  // Cycle lengths: per device (max over replicas; Chimera's group: over the twins), or one for all
  // when inline work exists (or Chimera without the group).
  plan.common_cycle = any_inline || (sch.pipelines > 1 && !per_pair);
  plan.sync_steps = sync_steps;
  plan.sync_step = *std::max_element(sync_steps.begin(), sync_steps.end());
  plan.refresh_steps.assign(D, 1);
  for (int d = 0; d < D; ++d)
    for (int w = 0; w < W; ++w) plan.refresh_steps[d] = std::max(plan.refresh_steps[d], rs[w].needed[d]);
  if (per_pair) {
    std::vector<int> r = plan.refresh_steps;
    for (int d = 0; d < D; ++d) plan.refresh_steps[d] = std::max(r[d], r[D - 1 - d]);
  }
  if (plan.common_cycle) {
    int R = *std::max_element(plan.refresh_steps.begin(), plan.refresh_steps.end());
    plan.refresh_steps.assign(D, R);
  }
  // A unit in the leading gap of step R runs in the next cycle's step 0 leading gap (wrapped);
  // units at steps < R stay where they are.
  plan.step0 = rs[0].tl0;
  plan.step0_time = 0;
  for (const ReplicaState& r : rs) plan.step0_time = std::max(plan.step0_time, r.tl0.step_time);
  plan.inline_time = plan.step0_time - plan.base_step_time;

  // Placed units, action lists.
  plan.cycle.assign(W, std::vector<std::vector<std::vector<Action>>>(D));
  plan.first.assign(W, std::vector<std::vector<Action>>(D));
  plan.first_cycle.assign(W, std::vector<std::vector<std::vector<Action>>>(D));
  plan.kfac_work.assign(D, 0);
  plan.device_inline.assign(D, 0);
  plan.bubble.assign(D, 0);
  plan.lower_bound_refresh_steps.assign(D, -1);
  plan.utilization_per_device.assign(D, 0);
  for (int w = 0; w < W; ++w) {
    ReplicaState& r = rs[w];
    for (int d = 0; d < D; ++d) {
      const int R = plan.refresh_steps[d];
      const auto& u = du[d].units;
      const Placer& pl = r.placers[d];
      // (cycle step, insert position, start, unit)
      struct Ins {
        int step, at;
        double start;
        int unit;
        bool wrapped;
      };
      std::vector<Ins> ins;
      double work = 0, inl = 0, busy_kfac = 0, pinned_time = 0;
      for (auto [i, idx] : r.inline_at[d]) {
        const TimedAction& t = r.tl0.per_device[d][idx];
        plan.units.push_back({u[i].a, w, d, 0, t.start, t.end, true, false});
        inl += u[i].dur;
      }
      for (size_t i = 0; i < u.size(); ++i) {
        if (!runs_on(u[i], w)) continue;
        work += u[i].dur;
        if (is_compute(u[i].a.kind)) busy_kfac += u[i].dur;
        if (r.gap_of[d][i] < 0) continue;
        const auto& G = pl.gaps[r.gap_of[d][i]];
        // Wrapped: in the next cycle's step G.step - R (its leading gap of step 0, or with a
        // period up to its step K), listed in this cycle step from the second cycle on.
        const bool wrapped = G.step >= R;
        PF_CHECK(G.step < R || (period_of[d] > 0 ? G.step <= R + sync_steps[d] : G.step == R && G.g.leading),
                 "unit beyond its cycle");
        const int step = wrapped ? G.step - R : G.step;
        const double off = pl.offset(G.step);
        ins.push_back({step, G.g.insert_at, r.start[d][i] - off, static_cast<int>(i), wrapped});
        plan.units.push_back({u[i].a, w, d, step, r.start[d][i] - off, r.start[d][i] - off + u[i].dur, false, wrapped});
      }
      // Pinned units (Chimera): after everything of cycle step K, syncs in stage order, then the
      // inversions that could not go into any gap.
      {
        std::vector<int> pinned;
        for (size_t i = 0; i < u.size(); ++i)
          if (u[i].pinned && runs_on(u[i], w)) pinned.push_back(static_cast<int>(i));
        // Per stage (stage order): its broadcasts (chain order), then its sync; then inversions.
        std::stable_sort(pinned.begin(), pinned.end(), [&](int a, int b) {
          const bool ia = !is_collective(u[a].a.kind), ib = !is_collective(u[b].a.kind);
          return std::tuple(ia, u[a].a.stage, u[a].a.pipeline, u[a].a.kind == Kind::SYNC_CURV) <
                 std::tuple(ib, u[b].a.stage, u[b].a.pipeline, u[b].a.kind == Kind::SYNC_CURV);
        });
        const int K = sync_steps[d];
        const int at = static_cast<int>((K == 0 ? r.step0.s : base.s).per_device[d].size());
        double t = K == 0 ? r.tl0.step_time : plan.base.step_time;
        for (int i : pinned) {
          ins.push_back({K, at, t, i, false});
          PlacedUnit pu{u[i].a, w, d, K, t, t + u[i].dur, true, false};
          pu.at_step_end = true;
          plan.units.push_back(pu);
          t += u[i].dur;
          inl += u[i].dur;
          pinned_time += u[i].dur;
        }
      }
      plan.kfac_work[d] = std::max(plan.kfac_work[d], work);
      plan.device_inline[d] = std::max(plan.device_inline[d], inl);
      // Action lists: insert back to front (by position, then start) into each step's list.
      std::stable_sort(ins.begin(), ins.end(), [](const Ins& a, const Ins& b) {
        return a.step != b.step ? a.step < b.step : a.at != b.at ? a.at > b.at : a.start > b.start;
      });
      auto& cyc = plan.cycle[w][d];
      for (int k = 0; k < R; ++k) cyc.push_back(k == 0 ? r.step0.s.per_device[d] : base.s.per_device[d]);
      // Inline syncs were timed as PREC; give them back their kind.
      for (auto [i, idx] : r.inline_at[d]) cyc[0][idx] = u[i].a;
      for (const Ins& x : ins) cyc[x.step].insert(cyc[x.step].begin() + x.at, u[x.unit].a);
      // The first cycle: without the wrapped units (no previous cycle to finish).
      for (int k = 0; k < R; ++k) {
        std::vector<Action> wrapped_actions, list;
        for (const Ins& x : ins)
          if (x.wrapped && x.step == k) wrapped_actions.push_back(u[x.unit].a);
        for (const Action& a : cyc[k]) {
          auto it = std::find(wrapped_actions.begin(), wrapped_actions.end(), a);
          if (it != wrapped_actions.end()) wrapped_actions.erase(it);
          else list.push_back(a);
        }
        plan.first_cycle[w][d].push_back(std::move(list));
      }
      plan.first[w][d] = plan.first_cycle[w][d][0];
      // Utilization over the device's cycle: F/B/PREC each step plus one cycle of K-FAC work.
      const double time = plan.step0_time + (R - 1) * plan.base_step_time + pinned_time;
      const double busy_steps = R * plan.base.busy[d];
      plan.utilization_per_device[d] += (busy_steps + busy_kfac) / time / W;
    }
  }
  for (int d = 0; d < D; ++d) {
    for (const StepGap& g : find_gaps(plan.base, d)) plan.bubble[d] += g.end - g.start;
    if (plan.bubble[d] > kEps)
      plan.lower_bound_refresh_steps[d] = static_cast<int>(std::ceil(plan.kfac_work[d] / plan.bubble[d] - 1e-12));
  }
  plan.utilization = std::accumulate(plan.utilization_per_device.begin(), plan.utilization_per_device.end(), 0.0) / D;
  const int P = plan.period();
  // Chimera's pinned units lengthen cycle step K (the busiest device's, as a bound). With one
  // cycle for all, once per period; with a cycle per pair of twins, each pair's once per its
  // cycle, and the pairs' lengthened steps may fall apart: their sum bounds the mean.
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
  return plan;
}

}  // namespace pf
