#pragma once
// The plan's timeline of one device's step: what the profiler's trace carries beside the measured
// one (each action's planned_start / planned_end), and `pipefisher report --account` reads.
#include "plan/planner.hpp"

#include <cstdint>
#include <vector>

namespace pf {

// Device `device` of replica `replica` in plan step t (steady state): the step's own actions
// (PREC and the optimizer steps included; with inline work, cycle step 0's) and the units of its
// cycle step, by start, times from the step's start. As KfacPlan::period_timeline draws them.
std::vector<TimedAction> planned_row(const KfacPlan& plan, int replica, int device, int64_t t);

}  // namespace pf
