#include "runtime/units/inline_placement.hpp"

#include "plan/planner.hpp"

namespace pf {

InlinePlacement::InlinePlacement(const InlineOptions& opts, const Layout& layout, int device, KfacUnits& units)
    : cadence_(opts.cadence),
      units_(units),
      list_(profiling_actions(layout.schedule, device).actions) {}

bool InlinePlacement::begin_step(int64_t step, const std::vector<MicroBatch>& mbs) {
  units_.begin_step(step);
  const bool curvature = cadence_.curvature_step(step), inversion = cadence_.inversion_step(step);
  for (HostedChunk& c : units_.hosted()) c.kfac->begin_whole_step(step, curvature, inversion, mbs);
  return false;
}

}  // namespace pf
