#pragma once
// `train --dry-run`: everything a run would check and predict, nothing it would write.
#include "config/config.hpp"

#include <string>

namespace pf::app {

// Resolves nothing further (cfg is the resolved configuration) and checks every input: the
// token files (sizes, vocabulary, token ranges; NSP's document index), --init's or --resume's
// weights against the model, the layout (stages, schedule, partition) and the memory estimate
// against what is available (refusing as the run would: UsageError). Then prints the memory per
// rank, and for a pipeline `pipefisher plan`'s report of its schedule: with PipeFisher, the plan
// from kfac.plan_profile when set, else from a cost model of the model's FLOPs at this machine's
// sgemm peak. Writes nothing. Returns the exit status.
int train_dry_run(const Config& cfg, const std::string& init, const std::string& resume);

}  // namespace pf::app
