#include "sim/sim.hpp"

#include "schedule/deps.hpp"
#include "schedule/validate.hpp"
#include "sim/limits.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace pf {

double Timeline::mean_bubble() const {
  double s = 0;
  for (double b : bubble) s += b;
  return bubble.empty() ? 0 : s / bubble.size();
}
double Timeline::mean_utilization() const {
  double s = 0;
  for (double u : utilization) s += u;
  return utilization.empty() ? 0 : s / utilization.size();
}

std::vector<Gap> Timeline::gaps(int device) const {
  constexpr double kEps = 1e-9;
  std::vector<Gap> out;
  const auto& row = per_device[device];
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
  if (step_time > t + kEps) out.push_back({t, step_time, static_cast<int>(row.size()), leading});
  return out;
}

namespace {

bool sends_data(Kind k) {  // an output that travels to another device
  return k == Kind::F || k == Kind::B || k == Kind::I || k == Kind::SEND_F || k == Kind::SEND_B;
}

// Peak number of held activations: (stage, micro-batch) from F start to its final backward end.
int peak_in_flight(const std::vector<TimedAction>& row) {
  std::vector<std::pair<double, int>> ev;  // (time, +1/-1); frees sort before allocations
  for (const TimedAction& t : row) {
    if (t.action.kind == Kind::F) ev.push_back({t.start, +1});
    if (t.action.kind == Kind::B || t.action.kind == Kind::W) ev.push_back({t.end, -1});
  }
  std::sort(ev.begin(), ev.end());
  int cur = 0, peak = 0;
  for (auto [time, delta] : ev) peak = std::max(peak, cur += delta);
  return peak;
}

// Event-driven simulation of one step: each device runs its list in order; an action starts when
// its device is free and its inputs have arrived (a message one p2p_time after its producer
// ends); a collective's members all start at the latest arrival.
class Simulation {
 public:
  Simulation(const Schedule& s, const CostModel& cost, const std::vector<std::vector<double>>* durations)
      : s_(s), cost_(cost), durations_(durations), deps_(build_dependencies(s)), next_(s.devices, 0),
        free_(s.devices, 0), remaining_(s.num_actions()) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    start_.resize(s.devices);
    end_.resize(s.devices);
    for (int d = 0; d < s.devices; ++d) {
      start_[d].assign(s.per_device[d].size(), nan);
      end_[d].assign(s.per_device[d].size(), nan);
    }
  }

  // Sweeps the devices until every action has run; ScheduleError when some never can.
  void run() {
    for (bool progress = true; progress && remaining_ > 0;) {
      progress = false;
      for (int d = 0; d < s_.devices; ++d) progress = advance(d) || progress;
    }
    if (remaining_ > 0) throw_stuck();
  }

  Timeline timeline() const;

 private:
  double duration(int d, size_t i) const {
    return durations_ ? (*durations_)[d][i] : cost_.duration(s_.per_device[d][i]);
  }

  // Time at which action (d, i)'s inputs are available, or NaN if something has not finished.
  double ready_at(int d, size_t i) const {
    double t = free_[d];
    for (const ActionRef& w : deps_.waits_for[d][i]) {
      double e = end_[w.device][w.index];
      if (std::isnan(e)) return std::numeric_limits<double>::quiet_NaN();
      const Action& src = s_.per_device[w.device][w.index];
      if (w.device != d && sends_data(src.kind)) e += cost_.p2p_time(src.stage);
      t = std::max(t, e);
    }
    return t;
  }

  void finish(int d, double t0, double t1) {
    start_[d][next_[d]] = t0;
    end_[d][next_[d]] = t1;
    free_[d] = t1;
    ++next_[d];
    --remaining_;
  }

  // Collective group g, reached by device d at time r: runs when every member is next in line
  // and ready, all starting at the latest arrival. False when some member is not.
  bool run_collective(int g, int d, size_t i, double r) {
    double t0 = r;
    for (const ActionRef& m : deps_.groups[g]) {
      if (next_[m.device] != static_cast<size_t>(m.index)) return false;
      double rm = ready_at(m.device, m.index);
      if (std::isnan(rm)) return false;
      t0 = std::max(t0, rm);
    }
    double t1 = t0 + duration(d, i);
    for (const ActionRef& m : deps_.groups[g]) finish(m.device, t0, t1);
    return true;
  }

  // Runs device d's actions until one is not ready; true if any ran.
  bool advance(int d) {
    bool progress = false;
    while (next_[d] < s_.per_device[d].size()) {
      const size_t i = next_[d];
      const Kind k = s_.per_device[d][i].kind;
      double r = ready_at(d, i);
      if (std::isnan(r)) break;
      int g = deps_.group_of[d][i];
      if (g >= 0) {
        if (!run_collective(g, d, i, r)) break;
      } else if (k == Kind::RECV_F || k == Kind::RECV_B) {
        // A receive is posted when the device reaches it and completes when the data arrives.
        finish(d, free_[d], r);
      } else {
        finish(d, r, r + duration(d, i));
      }
      progress = true;
    }
    return progress;
  }

  [[noreturn]] void throw_stuck() const {
    Cell stuck;
    for (int d = 0; d < s_.devices && stuck.device < 0; ++d)
      if (next_[d] < s_.per_device[d].size()) stuck = {d, static_cast<int>(next_[d])};
    throw ScheduleError(fmt::format("cannot finish: {} on device {} never becomes ready",
                                    to_token(s_.per_device[stuck.device][stuck.index]), stuck.device),
                        render_grid(s_, stuck));
  }

  const Schedule& s_;
  const CostModel& cost_;
  const std::vector<std::vector<double>>* durations_;
  Dependencies deps_;
  std::vector<std::vector<double>> start_, end_;  // [device][action]; NaN until it ran
  std::vector<size_t> next_;                      // [device] the next action to run
  std::vector<double> free_;                      // [device] when its last action ended
  size_t remaining_;
};

Timeline Simulation::timeline() const {
  Timeline tl;
  tl.per_device.resize(s_.devices);
  for (int d = 0; d < s_.devices; ++d) {
    for (size_t i = 0; i < s_.per_device[d].size(); ++i) {
      tl.per_device[d].push_back({s_.per_device[d][i], start_[d][i], end_[d][i]});
      tl.step_time = std::max(tl.step_time, end_[d][i]);
    }
  }
  for (int d = 0; d < s_.devices; ++d) {
    double busy = 0;
    for (const TimedAction& t : tl.per_device[d])
      if (is_compute(t.action.kind)) busy += t.end - t.start;
    tl.busy.push_back(busy);
    tl.bubble.push_back(tl.step_time - busy);
    tl.utilization.push_back(tl.step_time > 0 ? busy / tl.step_time : 0);
    tl.peak_in_flight.push_back(peak_in_flight(tl.per_device[d]));
  }
  return tl;
}

}  // namespace

Timeline simulate(const Schedule& s, const CostModel& cost, const std::vector<std::vector<double>>* durations) {
  check_schedule_size(s.devices, static_cast<int64_t>(s.num_actions()), false, "the schedule");
  Simulation sim(s, cost, durations);
  sim.run();
  return sim.timeline();
}

}  // namespace pf
