#include "plan/planned_row.hpp"

#include "core/error.hpp"

#include <algorithm>

namespace pf {

std::vector<TimedAction> planned_row(const KfacPlan& plan, int replica, int device, int64_t t) {
  PF_CHECK(replica >= 0 && replica < plan.replicas && device >= 0 && device < plan.devices && t >= 0,
           "replica {} device {} step {}", replica, device, t);
  const int k = static_cast<int>(t % plan.refresh_steps[device]);
  // Cycle step 0 of a common cycle carries the inline work (in step0's rows, not among the placed units).
  const bool first_of_cycle = plan.common_cycle && t % plan.period() == 0;
  std::vector<TimedAction> row = (first_of_cycle ? plan.step0 : plan.base).per_device[device];
  for (const PlacedUnit& u : plan.units())
    if (u.replica == replica && u.device == device && u.step == k && !u.inline_work)
      row.push_back({u.action, u.start, u.end});
  std::stable_sort(row.begin(), row.end(), [](const TimedAction& a, const TimedAction& b) { return a.start < b.start; });
  return row;
}

}  // namespace pf
