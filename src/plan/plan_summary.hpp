#pragma once
// The PipeFisher plan a run ended on, as its summary.json records it (train/run_log.hpp): each
// device's refresh cycle (steps), the planned step with K-FAC, without any K-FAC work, and with
// the precondition alone (ms), and the devices' mean utilization over the cycle (plan/planner.hpp's
// KfacPlan: step_time, plain_step_time, base_step_time).
#include <vector>

namespace pf {

struct PlanSummary {
  std::vector<int> refresh_steps;
  bool soap = false;  // the plan places SOAP's eigenbasis refreshes, not K-FAC's units
  double step_ms = 0, without_kfac_ms = 0, precondition_only_ms = 0, utilization = 0;
};

}  // namespace pf
