#pragma once
// The PipeFisher plan a run ended on, as its summary.json records it (train/run_log.hpp): each
// device's refresh cycle (steps), the planned step with the K-FAC units in the bubbles and
// without them (ms), and the devices' mean utilization over the cycle (plan/planner.hpp's KfacPlan).
#include <vector>

namespace pf {

struct PlanSummary {
  std::vector<int> refresh_steps;
  double step_ms = 0, without_kfac_ms = 0, utilization = 0;
};

}  // namespace pf
