#pragma once
// This rank's K-FAC state in checkpoints: `kfac-rank-R.safetensors` in the step directory, its
// tensors the hosted chunks' (runtime/units/kfac_units.hpp) and its "kfac_runtime" metadata the
// placement's state (runtime/kfac_placement.hpp) beside the units'. It continues only in the same
// layout (the caller checks) and the same kfac.placement (checked here). SOAP's refreshes in the
// bubbles keep their placement's state the same way, in `soap-rank-R.safetensors`.
#include "config/config.hpp"
#include "io/checkpoint.hpp"
#include "runtime/kfac_placement.hpp"
#include "runtime/units/kfac_units.hpp"

#include <string>
#include <vector>

namespace pf {

std::vector<CheckpointFile> write_kfac_state(const std::string& step_dir, int rank, const Config& cfg,
                                             const KfacUnits& units, const KfacPlacement& placement);
void load_kfac_state(const CheckpointReader& r, int rank, const Config& cfg, KfacUnits& units, KfacPlacement& placement);
std::vector<CheckpointFile> write_soap_state(const std::string& step_dir, int rank, const Config& cfg,
                                             const KfacPlacement& placement);
void load_soap_state(const CheckpointReader& r, int rank, const Config& cfg, KfacPlacement& placement);

}  // namespace pf
