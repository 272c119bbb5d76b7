// The planner's unit passes (see planner.cpp): the optimizer set aside, the K-FAC units of each
// device made (curvature, curvature sync, inversion), the inversions of a stage placed over its
// group (SPD-KFAC's Algorithm 1), and cycle step 0 with the inline work.
#include "core/error.hpp"
#include "core/triangle.hpp"
#include "plan/plan_state.hpp"

#include <algorithm>

namespace pf::plan {

void TimedSchedule::insert(int d, int at, const Action& a, double t) {
  s.per_device[d].insert(s.per_device[d].begin() + at, a);
  dur[d].insert(dur[d].begin() + at, t);
}
Timeline TimedSchedule::simulate() const { return pf::simulate(s, CostModel{}, &dur); }

bool runs_on(const Unit& x, int w) { return x.owner == kEveryRank || x.owner == w; }

const StageKfacCost& stage_cost(const PlanInput& in, int s) { return in.kfac.size() == 1 ? in.kfac[0] : in.kfac[s]; }

int holder_count(const PlanInput& in) {
  return (in.schedule.pipelines > 1 && in.chimera_group ? in.schedule.pipelines : 1) * in.replicas;
}

std::vector<std::pair<int, int>> stage_members(const PlanInput& in, int p, int s) {
  const int G = holder_count(in);
  std::vector<std::pair<int, int>> members;
  for (int m = 0; m < G; ++m) {
    const int q = G == in.replicas ? p : m / in.replicas;  // the member's pipeline copy
    members.push_back({in.schedule.device_of(q, s), m % in.replicas});
  }
  return members;
}

namespace {

// A unit larger than every gap (with margin) of a device whose largest gap is max_gap.
bool larger_than_every_gap(const PlanInput& in, double dur, double max_gap) {
  return max_gap <= kEps || dur * (1 + in.margin) > max_gap + kEps;
}

}  // namespace

// The optimizer steps end each device's list after every K-FAC unit of the step (lowering puts
// them last; only Chimera's second ALLREDUCE may follow the first OPT, and the first OPT waits
// for every all-reduce anyway): planned without them, appended to every list by emit_lists.
void set_aside_optimizer(PlanState& st) {
  PlanInput& in = st.in;
  st.optimizer.assign(in.schedule.devices, {});
  for (int d = 0; d < in.schedule.devices; ++d) {
    auto& list = in.schedule.per_device[d];
    std::vector<Action> kept;
    std::vector<double> dur;
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].kind == Kind::OPT) {
        st.optimizer[d].push_back(list[i]);
        continue;
      }
      kept.push_back(list[i]);
      if (!in.durations.empty()) dur.push_back(in.durations[d][i]);
    }
    list = std::move(kept);
    if (!in.durations.empty()) in.durations[d] = std::move(dur);
  }
}

namespace {

using UnitsOf = std::map<std::tuple<int, int, int, int>, std::vector<int>>;  // (p, s, side, layer) -> units

// CURV_A / CURV_B of every layer after the F (A; with recomputation after the backward) or the
// input-gradient backward (B, or I) of each micro-batch, A first.
void add_curvature_units(const PlanInput& in, const Timeline& step, DeviceUnits& du, UnitsOf& curv_of_factor,
                         std::map<std::pair<int, int>, std::vector<int>>& curv_of_stage) {
  auto& u = du.units;
  for (int side = 0; side < 2; ++side)
    for (const TimedAction& t : step.per_device[du.device]) {
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
}

// How many diagonal blocks an inversion runs as: 1 (whole), k > 1 (split: larger than every gap,
// or forced), 0 (inline: even a single row would not fit, or no gap at all).
int inversion_blocks(const PlanInput& in, double whole, int dim, double max_gap, const ForcedSplits& force,
                     const std::tuple<int, int, int, int>& key) {
  int k = 1;
  if (max_gap <= kEps) {
    k = 0;
  } else if (whole * (1 + in.margin) > max_gap + kEps) {  // larger than every gap: split if a split fits
    k = 0;
    for (int t = 2; t <= dim && k == 0; ++t)
      if (block_cost(whole, dim, t, 0) * (1 + in.margin) <= max_gap + kEps) k = t;
  }
  // A factor of dimension d has at most d diagonal blocks (BERT's NSP head: B is 2 x 2).
  if (k == 1 && force.count(key)) k = std::min(force.at(key), dim);
  return k;
}

// INV_A, then INV_B, of every layer of every hosted stage: whole, or its diagonal blocks.
void add_inversion_units(const PlanInput& in, DeviceUnits& du, double max_gap, UnitsOf& curv_of_factor,
                         std::map<std::pair<int, int>, int>& sync_of, std::vector<FactorSplit>& splits,
                         const ForcedSplits& force) {
  auto& u = du.units;
  for (int side = 0; side < 2; ++side)
    for (auto [p, s] : du.stages) {
      const StageKfacCost& c = stage_cost(in, s);
      const Kind kind = side == 0 ? Kind::INV_A : Kind::INV_B;
      for (int l = 0; l < c.layers(); ++l) {
        const double whole = side == 0 ? c.inv_a[l] : c.inv_b[l];
        const int dim = side == 0 ? c.dim_a[l] : c.dim_b[l];
        std::vector<int> deps = curv_of_factor[{p, s, side, l}];
        if (sync_of.count({p, s})) deps.push_back(sync_of[{p, s}]);
        const int k = inversion_blocks(in, whole, dim, max_gap, force, {p, s, side, l});
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
        x.inl = k == 0;
        u.push_back(x);
      }
    }
}

// Curvature and sync larger than every gap run inline; an inline unit's dependencies run inline
// before it (they must precede it in cycle step 0). Chimera: an inversion that must run inline
// waits for its (pinned) sync: it runs right after it, at the end of cycle step K.
void mark_inline(const PlanInput& in, std::vector<Unit>& u, double max_gap, bool chimera) {
  for (Unit& x : u)
    if (!x.pinned && larger_than_every_gap(in, x.dur, max_gap)) x.inl = true;
  for (size_t i = u.size(); i-- > 0;)  // back to front: deps come first
    if (u[i].inl)
      for (int dep : u[i].deps)
        if (!u[dep].pinned) u[dep].inl = true;
  if (chimera)
    for (Unit& x : u)
      if (x.inl && is_inversion(x.a.kind)) x.inl = false, x.pinned = true;
}

}  // namespace

// The units of device d in priority order: CURV_A, CURV_B, SYNC, INV_A, INV_B.
DeviceUnits make_device_units(const PlanInput& in, const Timeline& step, int d, double max_gap,
                              std::vector<FactorSplit>& splits, const ForcedSplits& force) {
  DeviceUnits du;
  du.device = d;
  for (const TimedAction& t : step.per_device[d])
    if (t.action.kind == Kind::F &&
        std::find(du.stages.begin(), du.stages.end(), std::pair{t.action.pipeline, t.action.stage}) == du.stages.end())
      du.stages.push_back({t.action.pipeline, t.action.stage});
  std::map<std::pair<int, int>, std::vector<int>> curv_of_stage;
  UnitsOf curv_of_factor;
  add_curvature_units(in, step, du, curv_of_factor, curv_of_stage);
  // SYNC_CURV per stage with several holders (replicas, or Chimera's twins: pinned).
  std::map<std::pair<int, int>, int> sync_of;
  const bool chimera = in.schedule.pipelines > 1;
  if (in.replicas > 1 || chimera)
    for (auto [p, s] : du.stages) {
      Unit x;
      x.a = Action{Kind::SYNC_CURV, s, p, -1, -1};
      // Never zero (as a broadcast): list order breaks ties in start time by start only.
      x.dur = std::max(stage_cost(in, s).sync, kMinCollective);
      x.deps = curv_of_stage[{p, s}];
      x.pinned = chimera;
      sync_of[{p, s}] = static_cast<int>(du.units.size());
      du.units.push_back(x);
    }
  add_inversion_units(in, du, max_gap, curv_of_factor, sync_of, splits, force);
  mark_inline(in, du.units, max_gap, chimera);
  return du;
}

void make_units(PlanState& st) {
  st.du.assign(st.devices(), {});
  for (int d = 0; d < st.devices(); ++d) st.du[d] = make_device_units(st.in, st.plan.base, d, st.decide_gap[d], st.plan.splits);
}

namespace {

// Broadcast of one inverse piece of size n: alpha + beta * bytes (4-byte floats: the upper
// triangle, or the n entries of a diagonal factor).
double bcast_time(const PlanInput& in, int64_t n, bool diagonal) {
  const double floats = diagonal ? static_cast<double>(n) : static_cast<double>(triangle_size(n));
  return in.bcast_alpha + in.bcast_beta * 4 * floats;
}

// The pieces of stage (p, s) among the device's units, for Algorithm 1: idx[k] is piece k's unit.
StagePlacement stage_pieces(const PlanInput& in, const DeviceUnits& du, int p, int s, std::vector<int>& idx) {
  const auto& u = du.units;
  const StageKfacCost& c = stage_cost(in, s);
  StagePlacement sp;
  sp.pipeline = p, sp.stage = s;
  sp.members = stage_members(in, p, s);
  for (int i = 0; i < static_cast<int>(u.size()); ++i) {
    const Action& a = u[i].a;
    if (a.pipeline != p || a.stage != s || !is_inversion(a.kind)) continue;
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
  return sp;
}

}  // namespace

// The holders of a stage (W replicas; with Chimera's group also both pipeline copies, member
// p * W + w) share its inversions by SPD-KFAC's Algorithm 1 (kfac/placement.hpp) over its pieces:
// NCT pieces run on every holder, CT pieces on their owner, each CT followed by a BCAST_INV unit
// on every holder (the previous cycle's inverse, before the stage's SYNC_CURV: chained in
// placement order, the sync after the last). Inline and pinned as the sync is. Every holder
// computes the same placement (same pieces: holders split alike, see place_precondition).
void place_device_inversions(const PlanInput& in, DeviceUnits& du, double max_gap) {
  const bool chimera = in.schedule.pipelines > 1;
  const int G = holder_count(in);
  du.placements.clear();
  if (G <= 1) return;
  auto& u = du.units;
  for (auto [p, s] : du.stages) {
    std::vector<int> idx;  // [piece] unit index
    StagePlacement sp = stage_pieces(in, du, p, s, idx);
    int sync = -1;
    for (int i = 0; i < static_cast<int>(u.size()); ++i)
      if (u[i].a.pipeline == p && u[i].a.stage == s && u[i].a.kind == Kind::SYNC_CURV) sync = i;
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
      b.inl = !chimera && larger_than_every_gap(in, b.dur, max_gap);
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

void place_inversions(PlanState& st) {
  for (int d = 0; d < st.devices(); ++d) place_device_inversions(st.in, st.du[d], st.decide_gap[d]);
}

namespace {

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

}  // namespace

void build_cycle_step0(PlanState& st) {
  st.rs.clear();
  for (int w = 0; w < st.replicas(); ++w) {
    ReplicaState r;
    r.step0 = with_inline(st.base, st.du, w, r.inline_at);
    r.tl0 = r.step0.simulate();
    st.rs.push_back(std::move(r));
  }
  st.any_inline = false;
  for (const ReplicaState& r : st.rs)
    for (const auto& at : r.inline_at)
      if (!at.empty()) st.any_inline = true;
}

}  // namespace pf::plan
