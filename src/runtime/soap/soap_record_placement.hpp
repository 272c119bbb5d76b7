#pragma once
// optim.name = soap with precond.placement = replay under mpirun (runtime/kfac_placement.hpp): every
// step runs the lowered list, and the refreshes a SOAP bubbles run recorded for it (its
// soap_refresh.json, optim/soap_record.hpp) as EIG_L / EIG_R units of this device's chunks, in the
// record's order, just before the device's first OPT. A refresh reads only the optimizer's state
// the previous update left, so on the recording run's layout this trains the recording run's bits
// wherever in the step the bubbles had put it (tests/runtime/test_soap_bubbles.cpp).
#include "comm/world.hpp"
#include "config/config.hpp"
#include "runtime/hosted_chunk.hpp"
#include "runtime/kfac_placement.hpp"
#include "runtime/layout.hpp"
#include "runtime/step_driver.hpp"

#include <map>
#include <vector>

namespace pf {

class SoapRecordPlacement final : public KfacPlacement {
 public:
  // Collective: reads cfg.kfac.refresh_record; UsageError naming it for a file that is not a SOAP
  // record, a run longer than it, or a weight no rank's SOAP rotates.
  SoapRecordPlacement(const Config& cfg, const Layout& layout, const comm::Groups& groups, HostedChunks& chunks);

  const std::vector<Action>& actions_for(int64_t step) const override;
  bool begin_step(int64_t, const std::vector<MicroBatch>&) override { return false; }
  void after_step(int64_t, const std::vector<Action>&, const std::vector<ActionTime>&) override {}
  int64_t plan_start() const override { return plan_start_; }
  int plan_period() const override { return period_; }
  const PlanProfile* plan_profile() const override { return nullptr; }
  StepDriver& driver() override { return in_order_; }
  // The record is by step: a resumed run follows it from its step on.
  void save_state(nlohmann::json&) const override {}
  void load_state(const nlohmann::json&, const std::string&, int64_t) override {}

 private:
  const std::vector<Action>& lowered_;
  std::map<int64_t, std::vector<Action>> lists_;  // the steps with refreshes on this device
  int64_t plan_start_ = 0;
  int period_ = 0;
  InOrder in_order_;
};

}  // namespace pf
