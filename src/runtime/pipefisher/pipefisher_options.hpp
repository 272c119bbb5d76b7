#pragma once
// PipeFisher's options (kfac.placement = bubbles, adaptive), parsed once from the configuration
// where the placement is built (train/mpi_run.cpp): the controller reads these typed fields, not
// the Config.
#include "config/config.hpp"
#include "plan/planner.hpp"
#include "runtime/layout.hpp"
#include "runtime/pipefisher/plan_source.hpp"
#include "runtime/plan_record.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace pf {

struct PipeFisherOptions {
  std::unique_ptr<const PlanSource> source;  // the profiling steps, or kfac.plan_profile's record
  // This run's timings may change the plan only when it was made from them: a recorded profile
  // fixes it for the whole run.
  bool replans_on_drift = false;  // kfac.replan_on_drift: drift drains, re-profiles and re-plans
  bool adapts = false;            // adaptive: re-plans from the planned steps' own timings
  PlanSettings settings;          // the planner's (kfac.split_inversions, min_refresh_steps, recompute)
  int max_refresh_steps = 0;      // adaptive: the longest cycle a re-plan may switch to (0: the profile's plan's)
  int64_t steps = 0;              // train.steps: no re-plan at the run's last step
  std::string out_dir;            // kfac_profile.json is written here (rank 0)
  PlanRecordRun record;           // what the plan's record says of this run (its shape)
};

// UsageError naming kfac.plan_profile when its record cannot be read or does not fit the layout.
PipeFisherOptions pipefisher_options(const Config& cfg, const Layout& layout);

}  // namespace pf
