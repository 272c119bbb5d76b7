#include "schedule/list_scheduler.hpp"

#include "core/error.hpp"

#include <algorithm>
#include <limits>

namespace pf {

std::vector<std::vector<Action>> list_schedule(const std::vector<ListTask>& tasks, int devices) {
  const int n = static_cast<int>(tasks.size());
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<int>> succ(n);
  std::vector<int> missing(n);
  for (int t = 0; t < n; ++t) {
    missing[t] = static_cast<int>(tasks[t].preds.size());
    for (int p : tasks[t].preds) succ[p].push_back(t);
  }
  std::vector<double> ready_time(n, 0), end(n, -1);
  std::vector<std::vector<int>> ready(devices);  // per device: tasks whose predecessors are done
  for (int t = 0; t < n; ++t)
    if (missing[t] == 0) ready[tasks[t].device].push_back(t);
  std::vector<double> free(devices, 0);
  std::vector<std::vector<Action>> order(devices);

  // Earliest time device d can start something: cached, recomputed when d's state changes.
  auto earliest = [&](int d) {
    double r = inf;
    for (int t : ready[d]) r = std::min(r, ready_time[t]);
    return r == inf ? inf : std::max(r, free[d]);
  };
  std::vector<double> est(devices);
  for (int d = 0; d < devices; ++d) est[d] = earliest(d);

  for (int done = 0; done < n; ++done) {
    int d = static_cast<int>(std::min_element(est.begin(), est.end()) - est.begin());
    PF_CHECK(est[d] < inf, "list scheduler: no runnable task ({} of {} placed)", done, n);
    const double t0 = est[d];
    int best = -1;
    for (int t : ready[d])
      if (ready_time[t] <= t0 && (best < 0 || tasks[t].priority < tasks[best].priority))
        best = t;
    ready[d].erase(std::find(ready[d].begin(), ready[d].end(), best));
    end[best] = t0 + tasks[best].duration;
    free[d] = end[best];
    order[d].push_back(tasks[best].action);
    for (int s : succ[best]) {
      ready_time[s] = std::max(ready_time[s], end[best]);
      if (--missing[s] == 0) {
        int sd = tasks[s].device;
        ready[sd].push_back(s);
        if (sd != d) est[sd] = earliest(sd);
      }
    }
    est[d] = earliest(d);
  }
  return order;
}

}  // namespace pf
