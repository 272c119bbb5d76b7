#pragma once
// A run's measured steps read back from its --profile-dir (runtime/profiler.hpp writes them):
// trace.json's events, each rank's actions in list order, and profile.json's shape.
//   TracedRun r = read_traced_run("runs/pf/profile", "--account");
//   r.steps[0].per_rank[1][4]   // rank 1's fifth action of the first profiled step
// Times are ms from the step's start, on rank 0's clock (the profiler's). An action of a step
// that followed a PipeFisher plan carries its planned start and end (the plan's clock, from the
// plan step's start); NaN otherwise (NVLAMB, profiling steps, a trace of an older build).
#include "schedule/action.hpp"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace pf {

struct TracedAction {
  Action action;
  double start = 0, end = 0;
  double planned_start = std::numeric_limits<double>::quiet_NaN();
  double planned_end = std::numeric_limits<double>::quiet_NaN();
  double taps = 0;  // ms of a pass in K-FAC's taps on its layers (args.kfac_taps_ms), part of its duration
  double duration() const { return end - start; }
  double without_taps() const { return duration() - taps; }
  bool planned() const { return std::isfinite(planned_start) && std::isfinite(planned_end); }
};

struct TracedStep {
  int step = 0;          // as the log numbers it (from 1)
  double step_time = 0;  // ms: the last action's end
  std::vector<std::vector<TracedAction>> per_rank;
};

struct TracedRun {
  std::string dir;
  int devices = 1;  // ranks of one pipeline replica: rank r is device r % devices of replica r / devices
  std::vector<TracedStep> steps;
};

// DIR/trace.json and DIR/profile.json of a --profile-dir. UsageError naming `flag` when a file is
// missing or not a profile of this project.
TracedRun read_traced_run(const std::string& dir, const std::string& flag);

}  // namespace pf
