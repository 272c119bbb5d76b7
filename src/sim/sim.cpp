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

}  // namespace

Timeline simulate(const Schedule& s, const CostModel& cost, const std::vector<std::vector<double>>* durations) {
  check_schedule_size(s.devices, static_cast<int64_t>(s.num_actions()), false, "the schedule");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Dependencies deps = build_dependencies(s);
  std::vector<std::vector<double>> start(s.devices), end(s.devices);
  for (int d = 0; d < s.devices; ++d) {
    start[d].assign(s.per_device[d].size(), nan);
    end[d].assign(s.per_device[d].size(), nan);
  }
  auto dur = [&](int d, size_t i) {
    return durations ? (*durations)[d][i] : cost.duration(s.per_device[d][i]);
  };
  std::vector<size_t> next(s.devices, 0);
  std::vector<double> free(s.devices, 0);
  size_t remaining = s.num_actions();

  // Time at which action (d, i)'s inputs are available, or NaN if something has not finished.
  auto ready_at = [&](int d, size_t i) {
    double t = free[d];
    for (const ActionRef& w : deps.waits_for[d][i]) {
      double e = end[w.device][w.index];
      if (std::isnan(e)) return nan;
      const Action& src = s.per_device[w.device][w.index];
      if (w.device != d && sends_data(src.kind)) e += cost.p2p_time(src.stage);
      t = std::max(t, e);
    }
    return t;
  };
  auto finish = [&](int d, double t0, double t1) {
    start[d][next[d]] = t0;
    end[d][next[d]] = t1;
    free[d] = t1;
    ++next[d];
    --remaining;
  };

  for (bool progress = true; progress && remaining > 0;) {
    progress = false;
    for (int d = 0; d < s.devices; ++d) {
      while (next[d] < s.per_device[d].size()) {
        const size_t i = next[d];
        const Kind k = s.per_device[d][i].kind;
        double r = ready_at(d, i);
        if (std::isnan(r)) break;
        int g = deps.group_of[d][i];
        if (g < 0) {
          // A receive is posted when the device reaches it and completes when the data arrives.
          double t0 = (k == Kind::RECV_F || k == Kind::RECV_B) ? free[d] : r;
          finish(d, t0, k == Kind::RECV_F || k == Kind::RECV_B ? r : r + dur(d, i));
          progress = true;
          continue;
        }
        // Collective: every member next in line and ready; all start at the latest arrival.
        double t0 = r;
        bool all = true;
        for (const ActionRef& m : deps.groups[g]) {
          if (next[m.device] != static_cast<size_t>(m.index)) { all = false; break; }
          double rm = ready_at(m.device, m.index);
          if (std::isnan(rm)) { all = false; break; }
          t0 = std::max(t0, rm);
        }
        if (!all) break;
        double t1 = t0 + dur(d, i);
        for (const ActionRef& m : deps.groups[g]) finish(m.device, t0, t1);
        progress = true;
      }
    }
  }
  if (remaining > 0) {
    Cell stuck;
    for (int d = 0; d < s.devices && stuck.device < 0; ++d)
      if (next[d] < s.per_device[d].size()) stuck = {d, static_cast<int>(next[d])};
    throw ScheduleError(fmt::format("cannot finish: {} on device {} never becomes ready",
                                    to_token(s.per_device[stuck.device][stuck.index]), stuck.device),
                        render_grid(s, stuck));
  }

  Timeline tl;
  tl.per_device.resize(s.devices);
  for (int d = 0; d < s.devices; ++d) {
    for (size_t i = 0; i < s.per_device[d].size(); ++i) {
      tl.per_device[d].push_back({s.per_device[d][i], start[d][i], end[d][i]});
      tl.step_time = std::max(tl.step_time, end[d][i]);
    }
  }
  for (int d = 0; d < s.devices; ++d) {
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

}  // namespace pf
