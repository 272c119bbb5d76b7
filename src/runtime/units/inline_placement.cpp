#include "runtime/units/inline_placement.hpp"

#include "plan/planner.hpp"

namespace pf {

InlinePlacement::InlinePlacement(const Config& cfg, const Layout& layout, int device, int replica, KfacUnits& units)
    : cadence_(refresh_cadence(cfg.kfac)),
      micro_batches_(layout.micro_batches),
      replica_(replica),
      units_(units),
      list_(profiling_actions(layout.schedule, device).actions) {}

bool InlinePlacement::begin_step(int64_t step, const std::vector<MicroBatch>& mbs) {
  units_.begin_step(step);
  const float scale = mbs.empty() ? 1.0f : mbs.front().loss_scale;
  const bool curvature = cadence_.curvature_step(step);
  for (HostedChunk& c : units_.hosted()) {
    HostedKfac& h = *c.kfac;
    h.chunk->begin_step(step, false, curvature, scale);
    // The DistributedKfac marks a factor complete at its chunk's last micro-batch of the step.
    if (curvature && h.dist)
      h.dist->begin_step(mbs.at(static_cast<size_t>(replica_) * micro_batches_ + c.last_backward_mb).index);
    h.prec = {PrecWork::Kind::refresh, curvature, cadence_.inversion_step(step), nullptr};
  }
  return false;
}

}  // namespace pf
