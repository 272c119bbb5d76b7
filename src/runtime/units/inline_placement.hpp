#pragma once
// kfac.placement = inline or skip in the MPI runtime (runtime/kfac_placement.hpp): every step runs
// the inline list (the lowered schedule with each hosted stage's PREC just before the device's
// first OPT); the taps accumulate curvature during the cadence's curvature steps (through the
// stage's DistributedKfac when it has copies) and PREC commits, inverts at the inversion steps
// and preconditions: the single-process Trainer's pattern (kfac/cadence.hpp).
#include "kfac/cadence.hpp"
#include "runtime/kfac_placement.hpp"
#include "runtime/layout.hpp"
#include "runtime/step_driver.hpp"
#include "runtime/units/kfac_units.hpp"

namespace pf {

// What the inline placement reads of the configuration, parsed once where it is built
// (train/mpi_run.cpp's make_placement), as PipeFisher's options are (pipefisher_options.hpp).
struct InlineOptions {
  KfacCadence cadence;  // kfac.placement and kfac.inverse_every (kfac/cadence.hpp)
};
inline InlineOptions inline_options(const KfacConfig& k) { return {refresh_cadence(k)}; }

class InlinePlacement final : public KfacPlacement {
 public:
  InlinePlacement(const InlineOptions& opts, const Layout& layout, int device, KfacUnits& units);

  const std::vector<Action>& actions_for(int64_t) const override { return list_; }
  bool begin_step(int64_t step, const std::vector<MicroBatch>& mbs) override;
  void after_step(int64_t, const std::vector<Action>&, const std::vector<ActionTime>&) override {}
  int64_t plan_start() const override { return 0; }
  int plan_period() const override { return 0; }
  const PlanProfile* plan_profile() const override { return nullptr; }
  StepDriver& driver() override { return in_order_; }
  void save_state(nlohmann::json&) const override {}
  void load_state(const nlohmann::json&, const std::string&, int64_t) override {}

 private:
  KfacCadence cadence_;
  KfacUnits& units_;
  std::vector<Action> list_;
  InOrder in_order_;
};

}  // namespace pf
