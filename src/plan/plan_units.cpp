// The planner's unit passes (see planner.cpp): the optimizer set aside, the K-FAC units of each
// device made (curvature, curvature sync, inversion), the inversions of a stage placed over its
// group (SPD-KFAC's Algorithm 1), and cycle step 0 with the inline work.
#include "core/error.hpp"
#include "core/triangle.hpp"
#include "plan/plan_state.hpp"

#include <algorithm>

namespace pf::plan {

void TimedSchedule::insert(int device, int at, const Action& action, double duration, bool replica_local) {
  local.resize(schedule.per_device.size());
  local[device].resize(schedule.per_device[device].size(), 0);
  schedule.per_device[device].insert(schedule.per_device[device].begin() + at, action);
  durations[device].insert(durations[device].begin() + at, duration);
  local[device].insert(local[device].begin() + at, replica_local);
}

// The simulator groups collectives of equal (kind, stage) across devices (Chimera's twins) and
// times them together; a replica-local one is handed to it as what it is timed as, the stage's
// device work after its gradients (PREC), and gets its kind back in the timeline.
Timeline TimedSchedule::simulate() const {
  Schedule timed = schedule;
  for (size_t d = 0; d < local.size(); ++d)
    for (size_t i = 0; i < local[d].size(); ++i)
      if (local[d][i]) timed.per_device[d][i].kind = Kind::PREC;
  Timeline timeline = pf::simulate(timed, links, &durations);
  for (size_t d = 0; d < local.size(); ++d)
    for (size_t i = 0; i < local[d].size(); ++i)
      if (local[d][i]) timeline.per_device[d][i].action = schedule.per_device[d][i];
  return timeline;
}

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
  return max_gap <= kEps || !gap_fit(in).holds(0, dur, max_gap);
}

}  // namespace

// The optimizer steps end each device's list after every K-FAC unit of the step (lowering puts
// them last; only Chimera's second ALLREDUCE may follow the first OPT, and the first OPT waits
// for every all-reduce anyway): planned without them, appended to every list by emit_lists.
OptimizerSetAside set_aside_optimizer(const PlanInput& input) {
  OptimizerSetAside out{input, std::vector<std::vector<Action>>(input.schedule.devices)};
  PlanInput& in = out.in;
  for (int d = 0; d < in.schedule.devices; ++d) {
    auto& list = in.schedule.per_device[d];
    std::vector<Action> kept;
    std::vector<double> dur;
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].kind == Kind::OPT) {
        out.optimizer[d].push_back(list[i]);
        continue;
      }
      kept.push_back(list[i]);
      if (!in.durations.empty()) dur.push_back(in.durations[d][i]);
    }
    list = std::move(kept);
    if (!in.durations.empty()) in.durations[d] = std::move(dur);
  }
  return out;
}

namespace {

// How many diagonal blocks an inversion runs as: 1 (whole), k > 1 (split: larger than every gap,
// or forced), 0 (inline: even a single row would not fit, or no gap at all).
int inversion_blocks(const PlanInput& in, double whole, int dim, double max_gap, const ForcedSplits& force,
                     const std::tuple<int, int, int, int>& key) {
  const Fit fit = gap_fit(in);
  int k = 1;
  if (max_gap <= kEps) {
    k = 0;
  } else if (!fit.holds(0, whole, max_gap)) {  // larger than every gap: split if a split fits
    k = 0;
    for (int t = 2; t <= dim && k == 0; ++t)
      if (fit.holds(0, block_cost(whole, dim, t, 0), max_gap)) k = t;
  }
  // A factor of dimension d has at most d diagonal blocks (BERT's NSP head: B is 2 x 2).
  if (k == 1 && force.count(key)) k = std::min(force.at(key), dim);
  return k;
}

// An inversion node: its factor whole, or its diagonal blocks, each reading what the node reads.
void add_inversion(const PlanInput& in, const KfacNode& node, const std::vector<int>& deps, double max_gap,
                   const ForcedSplits& force, DeviceUnits& dev_units) {
  const Kind kind = node.cost.kind;
  const int p = node.cost.pipeline, s = node.cost.stage, l = node.cost.layer, side = side_index(kind);
  const StageKfacCost& c = stage_cost(in, s);
  const double whole = c.unit(kind, l);
  const int dim = side == 0 ? c.dim_a[l] : c.dim_b[l];
  const int k = inversion_blocks(in, whole, dim, max_gap, force, {p, s, side, l});
  if (k > 1) {
    FactorSplit f{p, s, l, kind, k, whole, 0};
    for (int j = 0; j < k; ++j) {
      Unit x;
      x.action = Action{kind, s, p, -1, l, j};
      x.duration = block_cost(whole, dim, k, j);
      f.pieces += x.duration;
      x.deps = deps;
      dev_units.units.push_back(x);
    }
    dev_units.splits.push_back(f);
    return;
  }
  Unit x;
  x.action = node.action;
  x.duration = whole;
  x.deps = deps;
  x.runs_inline = k == 0;
  dev_units.units.push_back(x);
}

// The unit of a curvature, sync or SOAP node: a curvature unit is ready when the pass it reads ends; a
// sync (several holders: replicas, or Chimera's twins, where it is pinned) is never zero long, as
// a broadcast (list order breaks ties in start time by start only).
Unit node_unit(const PlanInput& in, const std::vector<TimedAction>& step, const KfacNode& node, std::vector<int> deps) {
  Unit x;
  x.action = node.action;
  x.deps = std::move(deps);
  const StageKfacCost& c = stage_cost(in, node.action.stage);
  if (node.action.kind == Kind::SYNC_CURV) {
    x.duration = std::max(c.sync, kMinCollective);
    x.pinned = in.schedule.pipelines > 1;
  } else {
    x.duration = c.unit(node.cost.kind, node.cost.layer);
    if (node.pass >= 0) x.ready = step[node.pass].end;  // curvature; SOAP's refreshes read no pass
  }
  return x;
}

// Curvature and sync larger than every gap run inline; an inline unit's dependencies run inline
// before it (they must precede it in cycle step 0). Chimera: an inversion that must run inline
// waits for its (pinned) sync: it runs right after it, at the end of cycle step K.
void mark_inline(const PlanInput& in, std::vector<Unit>& u, double max_gap, bool chimera) {
  for (Unit& x : u)
    if (!x.pinned && larger_than_every_gap(in, x.duration, max_gap)) x.runs_inline = true;
  for (size_t i = u.size(); i-- > 0;)  // back to front: deps come first
    if (u[i].runs_inline)
      for (int dep : u[i].deps)
        if (!u[dep].pinned) u[dep].runs_inline = true;
  if (chimera)
    for (Unit& x : u)
      if (x.runs_inline && is_inversion(x.action.kind)) x.runs_inline = false, x.pinned = true;
}

// The K-FAC graph's input: recomputation, a sync per stage with several holders, each stage's layers.
KfacGraphInput graph_input(const PlanInput& in) {
  KfacGraphInput g;
  g.work = in.work;
  g.rules.recompute = in.recompute;
  g.sync = in.work == BubbleWork::kfac && (in.replicas > 1 || in.schedule.pipelines > 1);
  for (int s = 0; s < in.schedule.stages; ++s)
    g.layers.push_back(in.kfac.size() == 1 || s < static_cast<int>(in.kfac.size()) ? stage_cost(in, s).layers() : 0);
  return g;
}

}  // namespace

// Device d's units: the K-FAC graph's nodes of its step (schedule/kfac_graph.hpp) in their
// priority order (CURV_A, CURV_B, SYNC, INV_A, INV_B), each inversion whole or as its blocks.
DeviceUnits make_device_units(const PlanInput& in, const Timeline& step, int d, double max_gap,
                              const ForcedSplits& force) {
  const std::vector<TimedAction>& row = step.per_device[d];
  std::vector<Action> list;
  for (const TimedAction& t : row) list.push_back(t.action);
  const KfacGraph graph = kfac_graph(list, graph_input(in));
  DeviceUnits dev_units;
  dev_units.device = d;
  dev_units.stages = graph.chunks;
  std::vector<int> unit_of;  // [node] its (first) unit
  for (const KfacNode& node : graph.nodes) {
    unit_of.push_back(static_cast<int>(dev_units.units.size()));
    std::vector<int> deps;
    for (int r : node.reads) deps.push_back(unit_of[r]);
    if (is_inversion(node.action.kind)) add_inversion(in, node, deps, max_gap, force, dev_units);
    else dev_units.units.push_back(node_unit(in, row, node, std::move(deps)));
  }
  mark_inline(in, dev_units.units, max_gap, in.schedule.pipelines > 1);
  return dev_units;
}


namespace {

// Broadcast of one inverse piece of size n: alpha + beta * bytes (4-byte floats: the upper
// triangle, or the n entries of a diagonal factor).
double bcast_time(const PlanInput& in, int64_t n, bool diagonal) {
  const double floats = diagonal ? static_cast<double>(n) : static_cast<double>(triangle_size(n));
  return in.bcast_alpha + in.bcast_beta * 4 * floats;
}

// The pieces of stage (p, s) among the device's units, for Algorithm 1: idx[k] is piece k's unit.
StagePlacement stage_pieces(const PlanInput& in, const DeviceUnits& dev_units, int p, int s, std::vector<int>& idx) {
  const auto& u = dev_units.units;
  const StageKfacCost& c = stage_cost(in, s);
  StagePlacement sp;
  sp.pipeline = p, sp.stage = s;
  sp.members = stage_members(in, p, s);
  for (int i = 0; i < static_cast<int>(u.size()); ++i) {
    const Action& a = u[i].action;
    if (a.pipeline != p || a.stage != s || !is_inversion(a.kind)) continue;
    const bool is_a = a.kind == Kind::INV_A;
    const int d = is_a ? c.dim_a[a.layer] : c.dim_b[a.layer];
    int64_t n = d;
    if (a.block >= 0) {  // sizes as kfac's split_blocks: the first d % k blocks get one more row
      int k = 0;
      for (const Unit& x : u) k += x.action.kind == a.kind && x.action.pipeline == p && x.action.stage == s && x.action.layer == a.layer;
      n = d / k + (a.block < d % k ? 1 : 0);
    }
    const bool diag = !is_a && !c.diag_b.empty() && c.diag_b[a.layer] != 0;
    idx.push_back(i);
    sp.pieces.push_back(a);
    sp.dims.push_back(n);
    sp.inv_time.push_back(u[i].duration);
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
void place_device_inversions(const PlanInput& in, DeviceUnits& dev_units, double max_gap) {
  const bool chimera = in.schedule.pipelines > 1;
  const int G = holder_count(in);
  dev_units.placements.clear();
  if (G <= 1 || in.work == BubbleWork::soap) return;  // SOAP: every holder refreshes its stage's factors
  auto& u = dev_units.units;
  for (auto [p, s] : dev_units.stages) {
    std::vector<int> idx;  // [piece] unit index
    StagePlacement sp = stage_pieces(in, dev_units, p, s, idx);
    int sync = -1;
    for (int i = 0; i < static_cast<int>(u.size()); ++i)
      if (u[i].action.pipeline == p && u[i].action.stage == s && u[i].action.kind == Kind::SYNC_CURV) sync = i;
    PF_CHECK(sync >= 0, "no SYNC_CURV for stage {} of pipeline {}", s, p);
    sp.placement = place_load_balanced(sp.dims, G, sp.inv_time, sp.bcast_time);
    std::vector<int> chain;  // the stage's broadcasts, in placement order
    for (int k : sp.placement.order) {
      const int m = sp.placement.owner[k];
      // The replica of this device that inverts the piece: every one (NCT), its owner, or none
      // (the owner is the other pipeline's copy).
      u[idx[k]].owner = m == kEveryRank ? kEveryRank : sp.members[m].first == dev_units.device ? sp.members[m].second : kNoReplica;
      if (m == kEveryRank) continue;
      const Action& inv = u[idx[k]].action;
      Unit b;
      b.action = Action{inv.kind == Kind::INV_A ? Kind::BCAST_INV_A : Kind::BCAST_INV_B, s, p, -1, inv.layer, inv.block};
      // Never zero: a zero-length unit would tie in start time with the next one, and list
      // order breaks ties by start only.
      b.duration = std::max(sp.bcast_time[k], kMinCollective);
      if (!chain.empty()) b.deps.push_back(chain.back());
      b.pinned = chimera;
      b.runs_inline = !chimera && larger_than_every_gap(in, b.duration, max_gap);
      chain.push_back(static_cast<int>(u.size()));
      u.push_back(b);
    }
    if (!chain.empty()) u[sync].deps.push_back(chain.back());
    // An inline sync needs its broadcasts inline before it; an inline broadcast the earlier ones.
    for (size_t j = chain.size(); j-- > 0;)
      if (!chimera && (u[sync].runs_inline || (j + 1 < chain.size() && u[chain[j + 1]].runs_inline))) u[chain[j]].runs_inline = true;
    dev_units.placements.push_back(std::move(sp));
  }
}

DeviceUnits device_units(const PlanInput& in, const Timeline& step, int device, double max_gap,
                         const ForcedSplits& force) {
  DeviceUnits made = make_device_units(in, step, device, max_gap, force);
  place_device_inversions(in, made, max_gap);
  return made;
}

std::vector<DeviceUnits> make_units(const PlanState& state) {
  std::vector<DeviceUnits> out;
  for (int d = 0; d < state.devices(); ++d)
    out.push_back(device_units(state.in, state.base.timeline, d, state.base.largest_shared_gap[d]));
  return out;
}

namespace {

// A device's units in inline order: unit order, but a stage's broadcasts right before its sync
// (they chain into it).
std::vector<size_t> inline_order(const std::vector<Unit>& units) {
  std::vector<size_t> order;
  for (size_t i = 0; i < units.size(); ++i) {
    const Action& a = units[i].action;
    if (is_bcast_inv(a.kind)) continue;
    if (a.kind == Kind::SYNC_CURV)
      for (size_t j = 0; j < units.size(); ++j)
        if (is_bcast_inv(units[j].action.kind) && units[j].action.stage == a.stage && units[j].action.pipeline == a.pipeline)
          order.push_back(j);
    order.push_back(i);
  }
  return order;
}

// Cycle step 0 of replica w: the step with PREC plus the inline units, each stage's just before
// its PREC (collectives run by the replica alone: TimedSchedule::local), and per inline unit its
// index in the device list.
CycleStep0 with_inline(const TimedSchedule& base, const std::vector<DeviceUnits>& dev_units, int w) {
  CycleStep0 step0{base, {}, std::vector<std::vector<std::pair<int, int>>>(dev_units.size())};
  for (size_t d = 0; d < dev_units.size(); ++d) {
    const auto& units = dev_units[d].units;
    auto& where = step0.inline_at[d];
    for (size_t i : inline_order(units)) {
      const Unit& unit = units[i];
      if (!unit.runs_inline || unit.pinned || !runs_on(unit, w)) continue;
      const auto& list = step0.step.schedule.per_device[d];
      int at = static_cast<int>(list.size());
      for (size_t j = 0; j < list.size(); ++j)
        if (list[j].kind == Kind::PREC && list[j].pipeline == unit.action.pipeline && list[j].stage == unit.action.stage)
          at = static_cast<int>(j);
      step0.step.insert(static_cast<int>(d), at, unit.action, unit.duration, is_collective(unit.action.kind));
      for (auto& [placed, index] : where)
        if (index >= at) ++index;
      where.push_back({static_cast<int>(i), at});
    }
  }
  step0.timeline = step0.step.simulate();
  return step0;
}

}  // namespace

std::vector<CycleStep0> build_cycle_step0(const PlanState& state) {
  std::vector<CycleStep0> out;
  for (int w = 0; w < state.replicas(); ++w) out.push_back(with_inline(state.base.timed, state.device_units, w));
  return out;
}

}  // namespace pf::plan
