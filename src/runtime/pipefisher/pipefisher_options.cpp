// PipeFisher's options from the configuration (pipefisher_options.hpp).
#include "runtime/pipefisher/pipefisher_options.hpp"

#include "config/placement.hpp"

namespace pf {

PipeFisherOptions pipefisher_options(const Config& cfg, const Layout& layout) {
  const KfacConfig& k = cfg.kfac;
  PipeFisherOptions o;
  const bool recorded = !k.plan_profile.empty();
  if (recorded) o.source = std::make_unique<RecordedPlan>(read_plan_profile(cfg, layout), k.plan_profile);
  else o.source = std::make_unique<ProfiledPlan>();
  o.replans_on_drift = k.replan_on_drift && !recorded;
  o.adapts = placement_spec(k).fills_waits && !recorded;
  // Chimera: a stage's twins and their replicas form one group sharing its inversions, each pair
  // of twins with its own cycle (PlanSettings::chimera_group, the default).
  o.settings = PlanSettings{.replicas = layout.replicas,
                            .split_to_shorten = k.split_inversions,
                            .recompute = cfg.parallel.recompute && layout.stages() > 1,
                            .min_refresh_steps = k.min_refresh_steps};
  o.max_refresh_steps = k.max_refresh_steps;
  o.steps = cfg.train.steps;
  o.out_dir = cfg.train.out_dir;
  o.record = plan_record_run(cfg, layout);
  return o;
}

}  // namespace pf
