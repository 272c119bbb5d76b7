#pragma once
// `train --dry-run`: everything a run would check and predict, nothing it would write.
#include "config/config.hpp"

#include <string>

namespace pf::app {

// The report of `train --dry-run`, after the run's own set-up checked everything it would check
// (train/train_loop.hpp: TrainRunArgs::dry_run) and before its first write: the memory per rank,
// and for a pipeline `pipefisher plan`'s report of its schedule: with PipeFisher, the plan from
// kfac.plan_profile when set, else from a cost model of the model's FLOPs at this machine's sgemm
// peak. Writes nothing. Returns the exit status.
int train_dry_run(const Config& cfg);

}  // namespace pf::app
