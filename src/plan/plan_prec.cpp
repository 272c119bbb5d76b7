// The planner's precondition passes (see planner.cpp): a stage's precondition split by layer
// among its holders (PrecSplit), then every PREC placed into the step, which gives the base step
// that every other K-FAC unit is placed around.
#include "core/error.hpp"
#include "plan/plan_state.hpp"

#include <algorithm>
#include <numeric>

namespace pf::plan {

namespace {

// Bytes a CT layer's PREC sends in the all-gather: the weight's and bias's preconditioned
// gradients and its v.g for the KL-clip (a double as two floats), 4-byte floats.
double gather_bytes(const StageKfacCost& c, int l) {
  return 4.0 * (static_cast<double>(c.dim_a[l]) * c.dim_b[l] + c.dim_b[l] + 2);
}

// Algorithm 1 over the stage's layers, and each member's PREC time.
PrecSplit place_layers(const PlanInput& in, int p, int s) {
  const StageKfacCost& c = stage_cost(in, s);
  PrecSplit ps;
  ps.pipeline = p, ps.stage = s;
  ps.members = stage_members(in, p, s);
  ps.layer_time = precondition_by_layer(c);
  const int G = static_cast<int>(ps.members.size());
  std::vector<int64_t> size;
  std::vector<double> comm;
  for (int l = 0; l < c.layers(); ++l) {
    size.push_back(int64_t{c.dim_a[l]} * c.dim_b[l]);
    comm.push_back(in.bcast_beta * gather_bytes(c, l));
  }
  ps.placement = place_load_balanced(size, G, ps.layer_time, comm);
  auto member_times = [&] {
    ps.time.assign(G, 0.0);
    for (int m = 0; m < G; ++m) {
      double received = -1;  // bytes; -1: no gather
      for (int l = 0; l < c.layers(); ++l) {
        const int o = ps.placement.owner[l];
        if (o == kEveryRank || o == m) ps.time[m] += ps.layer_time[l];
        if (o != kEveryRank) received = std::max(received, 0.0) + (o == m ? 0.0 : gather_bytes(c, l));
      }
      if (received >= 0) ps.time[m] += in.bcast_alpha + in.bcast_beta * received;
    }
  };
  member_times();
  // A split that does not shorten the busiest holder's PREC is not worth its gather.
  if (*std::max_element(ps.time.begin(), ps.time.end()) >= c.precondition) {
    std::fill(ps.placement.owner.begin(), ps.placement.owner.end(), kEveryRank);
    member_times();
  }
  return ps;
}

// PREC(p,s) of one device: when it is ready (after the stage's last backward and ALLREDUCE) and
// the index of that last dependency.
struct PrecReady {
  int p, s;
  double ready;
  int after;
};
std::vector<PrecReady> precondition_order(const Timeline& tl, int d) {
  std::map<std::pair<int, int>, PrecReady> stages;
  const auto& row = tl.per_device[d];
  for (size_t i = 0; i < row.size(); ++i) {
    const Action& a = row[i].action;
    if (a.kind != Kind::B && a.kind != Kind::W && a.kind != Kind::ALLREDUCE) continue;
    PrecReady& p = stages.try_emplace({a.pipeline, a.stage}, PrecReady{a.pipeline, a.stage, 0, -1}).first->second;
    p.ready = std::max(p.ready, row[i].end);
    p.after = static_cast<int>(i);
  }
  std::vector<PrecReady> order;
  for (auto& [k, p] : stages) order.push_back(p);
  std::stable_sort(order.begin(), order.end(), [](const PrecReady& a, const PrecReady& b) { return a.ready < b.ready; });
  return order;
}

// Device d's PRECs into the step `tl` times (ts, its schedule): `gaps`, the first gap after the
// stage's gradients where it fits with margin, else at the device's end; `end`, at the end.
void insert_preconditions(const PlanState& state, const Timeline& tl, int d, TimedSchedule& ts) {
  std::vector<Gap> gaps = tl.gaps(d);
  std::vector<std::pair<int, PrecReady>> inserts;  // (position in the original list, what)
  for (const PrecReady& p : precondition_order(tl, d)) {
    const double t = precondition_time(state, d, p.p, p.s);
    int at = static_cast<int>(tl.per_device[d].size());
    for (Gap& g : gaps) {
      if (state.in.precondition == PrecPlacement::end) break;
      const double s0 = std::max(g.start, p.ready);
      if (g.insert_at > p.after && gap_fit(state.in).holds(s0, t, g.end)) {
        at = g.insert_at;
        g.start = s0 + t;
        break;
      }
    }
    inserts.push_back({at, p});
  }
  // Insert back to front; equal positions keep their readiness order.
  for (size_t k = inserts.size(); k-- > 0;) {
    const PrecReady& p = inserts[k].second;
    ts.insert(d, inserts[k].first, Action{Kind::PREC, p.s, p.p, -1, -1}, precondition_time(state, d, p.p, p.s));
  }
}

// SOAP's STAT(p,s,l) of device d's chunks (in the order of their first forward, weight by weight)
// into the step `tl` times: each into the first gap that holds it with margin (it adds the
// previous step's gradient: nothing of this step), else at the device's end, before its optimizer
// steps.
void insert_statistics(const PlanState& state, const Timeline& tl, int d, TimedSchedule& ts) {
  std::vector<Gap> gaps = tl.gaps(d);
  std::vector<std::pair<int, int>> chunks;  // (pipeline, stage)
  for (const TimedAction& t : tl.per_device[d])
    if (t.action.kind == Kind::F && std::find(chunks.begin(), chunks.end(), std::pair{t.action.pipeline, t.action.stage}) == chunks.end())
      chunks.push_back({t.action.pipeline, t.action.stage});
  std::vector<std::pair<int, Action>> inserts;  // (position in the original list, what)
  for (auto [p, s] : chunks)
    for (int l = 0; l < stage_cost(state.in, s).layers(); ++l) {
      const double t = stage_cost(state.in, s).statistics.at(l);
      int at = static_cast<int>(tl.per_device[d].size());
      for (Gap& g : gaps)
        if (gap_fit(state.in).holds(g.start, t, g.end)) {
          at = g.insert_at;
          g.start += t;
          break;
        }
      inserts.push_back({at, Action{Kind::STAT, s, p, -1, l}});
    }
  for (size_t k = inserts.size(); k-- > 0;) {
    const Action& a = inserts[k].second;
    ts.insert(d, inserts[k].first, a, stage_cost(state.in, a.stage).statistics.at(a.layer));
  }
}

// Every holder of a stage must split its factors alike (Chimera's twins: same weights, same
// preconditioning): the split and inline decisions use the smallest largest gap among the
// devices hosting any of the device's stages.
std::vector<double> largest_shared_gaps(const Schedule& sch, const Timeline& base) {
  const int D = sch.devices;
  std::vector<double> max_gap(D, 0.0);
  for (int d = 0; d < D; ++d)
    for (const Gap& g : base.gaps(d)) max_gap[d] = std::max(max_gap[d], g.end - g.start);
  std::vector<double> shared = max_gap;
  for (int d = 0; d < D; ++d)
    for (int e = 0; e < D; ++e)
      for (int p = 0; p < sch.pipelines; ++p)
        for (int q = 0; q < sch.pipelines; ++q)
          for (int s = 0; s < sch.stages; ++s)
            if (sch.device_of(p, s) == d && sch.device_of(q, s) == e) shared[d] = std::min(shared[d], max_gap[e]);
  return shared;
}

}  // namespace

double precondition_time(const PlanState& state, int d, int p, int s) {
  const PrecSplit* ps = find_prec_split(state.prec_splits, p, s);
  if (!ps) return stage_cost(state.in, s).precondition;
  double t = 0;
  for (size_t m = 0; m < ps->members.size(); ++m)
    if (ps->members[m].first == d) t = std::max(t, ps->time[m]);
  return t;
}

// Every (pipeline, stage) with several holders: its layers placed over them (PrecSplit). Without
// Chimera's group the twins are no holders of each other's copy (each preconditions all of it).
std::vector<PrecSplit> split_precondition(const PlanState& state) {
  std::vector<PrecSplit> out;
  if (holder_count(state.in) <= 1 || state.in.work == BubbleWork::soap) return out;
  const Schedule& sch = state.in.schedule;
  for (int p = 0; p < sch.pipelines; ++p)
    for (int s = 0; s < sch.stages; ++s) out.push_back(place_layers(state.in, p, s));
  return out;
}

// PREC(p,s) for each hosted stage (insert_preconditions, as PlanInput::precondition says) into
// the step place_weight_gradients left; SOAP's STAT(p,s) instead (insert_statistics). Then the step
// with PREC (or STAT) is the base every other unit is placed around; its largest gaps decide splits
// and inline work.
BaseStep place_precondition(const PlanState& state) {
  const PlanInput& in = state.in;
  const int D = in.schedule.devices;
  PF_CHECK(in.precondition != PrecPlacement::best, "plan_kfac decides PrecPlacement::best");
  BaseStep out{state.step.timed, {}, 0, {}};
  TimedSchedule& ts = out.timed;
  const Timeline tl = ts.simulate();
  out.plain_step_time = tl.step_time;
  for (int d = 0; d < D; ++d)  // SOAP has no PREC: its rotations are its OPT's
    if (in.work == BubbleWork::kfac) insert_preconditions(state, tl, d, ts);
    else insert_statistics(state, tl, d, ts);
  out.timeline = ts.simulate();
  out.largest_shared_gap = largest_shared_gaps(in.schedule, out.timeline);
  return out;
}

}  // namespace pf::plan
