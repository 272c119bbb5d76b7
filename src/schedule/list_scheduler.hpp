#pragma once
// A greedy list scheduler used by the generator whose order is easiest to state as a rule
// (Chimera): whenever a device is free it runs, among its tasks whose predecessors are
// done, the one with the smallest priority key; it never waits while something is ready. The
// resulting per-device order (by start time) is the schedule; timing is recomputed later by the
// simulator with real durations.
#include "schedule/action.hpp"

#include <array>
#include <vector>

namespace pf {

struct ListTask {
  Action action;
  int device = 0;
  double duration = 1;
  std::vector<int> preds;            // indices of tasks that must finish first
  std::array<int, 4> priority{};     // smaller runs first, compared lexicographically
};

// Returns per-device orders.
std::vector<std::vector<Action>> list_schedule(const std::vector<ListTask>& tasks, int devices);

}  // namespace pf
