// The planner's zero-bubble pass (see planner.cpp): the step before any K-FAC work, timed, with
// each weight gradient (W) moved into the earliest gap of its device that holds it. A
// zero-bubble generator orders W for unit times; with measured ones (T_W != T_F) a W often sits
// after a gap it would have fitted. W carries the step's gradient: it takes the gaps first, and
// PREC and the K-FAC units are placed around the step it leaves.
#include "plan/plan_state.hpp"

#include <algorithm>
#include <set>
#include <tuple>

namespace pf::plan {

namespace {

// The step as the input orders it: its durations measured, or from the cost model.
TimedSchedule timed_input(const PlanInput& in) {
  TimedSchedule ts{.schedule = in.schedule, .links = in.cost};
  for (int d = 0; d < in.schedule.devices; ++d) {
    ts.durations.emplace_back();
    for (size_t i = 0; i < in.schedule.per_device[d].size(); ++i)
      ts.durations[d].push_back(in.durations.empty() ? in.cost.duration(in.schedule.per_device[d][i]) : in.durations[d][i]);
  }
  return ts;
}

// Where W at index i of device d may go: the insert position of the earliest gap before it
// that holds it with margin from when it is ready, or -1. Ready: its I has ended and so has the
// device's previous W, which it stays behind (the output gradients kept for W are freed first in,
// first out, as sim/memory.cpp and the runtime count them).
int earlier_gap(const TimedSchedule& ts, const Timeline& tl, const std::vector<Gap>& gaps, int d, int i,
                const Fit& fit) {
  const std::vector<Action>& row = ts.schedule.per_device[d];
  const Action& w = row[i];
  int after = -1;
  double ready = 0;
  for (int j = 0; j < i; ++j) {
    const Action& a = row[j];
    const bool its_input = a.kind == Kind::I && a.pipeline == w.pipeline && a.stage == w.stage && a.micro_batch == w.micro_batch;
    if (a.kind != Kind::W && !its_input) continue;
    after = j;
    ready = std::max(ready, tl.per_device[d][j].end);
  }
  for (const Gap& g : gaps) {
    if (g.insert_at >= i) break;
    if (g.insert_at > after && fit.holds(std::max(g.start, ready), ts.durations[d][i], g.end)) return g.insert_at;
  }
  return -1;
}

// Action `from` of device d moved to index `to` < from (what lies between shifts one later).
void move_earlier(TimedSchedule& ts, int d, int from, int to) {
  auto& row = ts.schedule.per_device[d];
  std::rotate(row.begin() + to, row.begin() + from, row.begin() + from + 1);
  std::rotate(ts.durations[d].begin() + to, ts.durations[d].begin() + from, ts.durations[d].begin() + from + 1);
  if (static_cast<size_t>(d) < ts.local.size() && !ts.local[d].empty())
    std::rotate(ts.local[d].begin() + to, ts.local[d].begin() + from, ts.local[d].begin() + from + 1);
}

}  // namespace

// Every W, device by device in its order, into the earliest gap that holds it (earlier_gap), the
// step re-timed after each move (what follows a moved W shifts); again until no W moves (a move
// can open a gap elsewhere). A W only moves earlier in its list, past no other W: this ends. A
// move that would lengthen the step is not made (a W that fits a gap delays nothing).
WeightGradientStep place_weight_gradients(const PlanState& state) {
  WeightGradientStep out{timed_input(state.in), {}};
  TimedSchedule& ts = out.timed;
  Timeline tl = ts.simulate();
  WeightGradientMoves& wm = out.moves;
  wm = WeightGradientMoves{.step_before = tl.step_time, .step_after = tl.step_time};
  for (const auto& row : ts.schedule.per_device)
    wm.total += static_cast<int>(std::count_if(row.begin(), row.end(), [](const Action& a) { return a.kind == Kind::W; }));
  std::set<std::tuple<int, int, int, int>> moved;  // (device, pipeline, stage, micro-batch)
  for (bool again = wm.total > 0; again;) {
    again = false;
    for (int d = 0; d < state.devices(); ++d) {
      std::vector<Gap> gaps = tl.gaps(d);
      for (int i = 0; i < static_cast<int>(ts.schedule.per_device[d].size()); ++i) {
        if (ts.schedule.per_device[d][i].kind != Kind::W) continue;
        const int to = earlier_gap(ts, tl, gaps, d, i, gap_fit(state.in));
        if (to < 0) continue;
        TimedSchedule trial = ts;
        move_earlier(trial, d, i, to);
        Timeline t = trial.simulate();
        if (t.step_time > tl.step_time + kEps) continue;
        const Action& w = trial.schedule.per_device[d][to];
        moved.insert({d, w.pipeline, w.stage, w.micro_batch});
        ts = std::move(trial);
        tl = std::move(t);
        gaps = tl.gaps(d);
        again = true;
      }
    }
  }
  wm.moved = static_cast<int>(moved.size());
  wm.step_after = tl.step_time;
  return out;
}

}  // namespace pf::plan
