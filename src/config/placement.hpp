#pragma once
// What each precond.placement is, in one place: the setting is compared here and nowhere else, and
// every other part (the checks, the banner, the trainer, the MPI engine, the cadence) asks the
// spec's named fields. A new placement is one more case in placement_spec.
#include "config/config.hpp"

#include <string>

namespace pf {

struct PlacementSpec {
  // PipeFisher (bubbles, adaptive): K-FAC's units profiled, planned into a pipeline's bubbles and
  // run where the plan puts them; needs a pipeline, under mpirun.
  bool planned = false;
  // adaptive: the plan's curvature and inversion units placed at run time into the waits each
  // rank sees (runtime/bubble_filler.hpp).
  bool fills_waits = false;
  // replay: one process following a pipeline's recorded refresh pattern (kfac.refresh_record).
  bool replays = false;
  // inline, skip: every step runs the inline list and PREC refreshes on the critical path; a stage
  // with copies shares the refresh by kfac.distributed.
  bool inline_refresh = false;
  // The inline refresh's cadence (kfac/cadence.hpp): curvature every this many steps (inline: 1;
  // else kfac.inverse_every, skip's "curvature only at the refresh steps").
  int curvature_every = 1;
  // skip, for SOAP: its statistics L and R take a gradient only on the steps that end with a basis
  // refresh (every optim.soap.precondition_frequency), as K-FAC's skip gathers curvature only on
  // its refresh steps (curvature_every).
  bool statistics_at_refreshes_only = false;
  // Where K-FAC runs, as the banner says it: "inline", "in the pipeline bubbles: PipeFisher", ...
  std::string where;
};

// The spec of k.placement (read whether or not K-FAC is on).
PlacementSpec placement_spec(const KfacConfig& k);

// The placement places SOAP's work (its eigenbasis refreshes): optim.name = soap without K-FAC
// (the two are not stacked; validate refuses both on).
inline bool places_soap_work(const Config& c) { return c.optim.name == OptimName::Soap && !c.kfac.enabled; }

}  // namespace pf
