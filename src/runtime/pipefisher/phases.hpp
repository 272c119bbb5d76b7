#pragma once
// PipeFisher's phases (controller.hpp) as small states: each owns its fields, and at a step's end
// the controller's phase becomes the one its step end returns (controller_phases.cpp):
//
//   Profiling --(its last step: the plan)--> Planned --(drift)--> Draining --(replan_at)--> Profiling
//                                             |  ^
//                      (adaptive: a re-plan)  v  |  (after its one step)
//                                           Switching
//
// Every phase knows the step 0 of the plan in use (plan_start; kProfileSteps before the first
// plan), which the refresh record keeps.
#include "runtime/pipefisher/plan_source.hpp"
#include "schedule/action.hpp"

#include <cstdint>
#include <variant>
#include <vector>

namespace pf {

// A profiled step's list and, per entry, the lowered action it times (-1: an added PREC, or a
// previous cycle's wrapped unit, which the profile does not count).
struct ProfiledList {
  std::vector<Action> actions;
  std::vector<int> lowered_index;
};

// Steps [start, start + kProfileSteps) run the inline list, every unit timed at PREC; the first
// runs `first`: after a drain whose boundary on this device was `start`, the ended cycle's
// wrapped units come before the inline list.
struct Profiling {
  int64_t start = 0;
  int64_t plan_start = kProfileSteps;  // the plan in use (none yet: kProfileSteps)
  int64_t drained_boundary = -1;       // the drain's boundary on this device (-1: no drain before)
  ProfiledList first;
};

// Step t runs plan.actions(replica, device, t - plan_start); a cycle begins where the plan says.
struct Planned {
  int64_t plan_start = 0;
  int drift_steps = 0;  // consecutive steps far over the profile
};

// Drift decided: this device finishes its cycle (steps before `boundary` run the plan), runs
// `first` at the boundary (the cycle's wrapped units, then a plain step) and `plain` after it,
// until replan_at, where every device profiles again.
struct Draining {
  int64_t plan_start = 0, boundary = 0, replan_at = 0;
  std::vector<Action> first, plain;
};

// adaptive: step `at`, the re-plan's step 0, runs the previous plan's wrapped units of the ended
// cycle, then the new plan's step 0; after it, Planned from `at`.
struct Switching {
  int64_t at = 0;
  std::vector<Action> first;
  int drift_steps = 0;
};

using Phase = std::variant<Profiling, Planned, Draining, Switching>;

// The phase as checkpoints hold it, in the keys earlier builds wrote: steps from the profile's
// start, the plan's step 0, a drain's boundary and re-plan step (-1: none), drift's count, and
// adaptive's switch (-1: none).
struct PhaseRecord {
  int64_t profile_start = 0, plan_start = kProfileSteps, boundary = -1, replan_at = -1;
  int drift_steps = 0;
  int64_t switch_at = -1;
  std::vector<Action> switch_first;
};

}  // namespace pf
