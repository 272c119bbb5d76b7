#pragma once
// optim.name = soap with precond.placement = bubbles in the MPI runtime (runtime/kfac_placement.hpp):
// SOAP's eigenbasis refreshes are units of the K-FAC graph (EIG_L, EIG_R per rotated weight:
// schedule/kfac_graph.hpp), placed into the pipeline's bubbles by the PipeFisher planner
// (plan/planner.hpp, BubbleWork::soap) and run by the executor, whose EIG handler refreshes the
// factor in the chunk's Soap (optim/optimizer.hpp). Two phases:
//   profiling  kProfileSteps steps run the lowered list, timed; no basis moves but the first
//              step's (each Soap refreshes by units only); at the last, each rank times its
//              factors' refreshes on copies, every rank all-reduces the timings and plans from
//              them (the same bits on every rank: the same plan)
//   planned    step t runs plan.actions(replica, device, t - plan_start); the refresh cycle is
//              the plan's, at least optim.soap.precondition_frequency (and precond.min_refresh_steps).
//              Each rotated weight's STAT (every step, where the plan put it) adds its previous step's
//              gradients to its statistics (Soap::defer_statistics: the same bits as inline)
// Each refresh that ran is recorded (out_dir/soap_refresh.json, optim/soap_record.hpp), which a
// single process follows with precond.placement = replay. Under Chimera the plan puts each factor's
// two copies' refreshes (the twins') in one step, and pipeline 0's are recorded. The profile the
// plan was made from is written to out_dir/soap_profile.json; precond.plan_profile names such a
// file (or --profile-dir's profile.json) to plan from it instead of this run's timings: the same
// plan for every run of the configuration. Not built yet: drift re-planning, adaptive. A
// checkpoint keeps the profile the plan was made from (every rank's copy: the all-reduced one) and
// this rank's refreshes, so a resumed run remakes the same plan and its record covers the whole run.
#include "comm/world.hpp"
#include "config/config.hpp"
#include "optim/soap_record.hpp"
#include "plan/planner.hpp"
#include "runtime/hosted_chunk.hpp"
#include "runtime/kfac_placement.hpp"
#include "runtime/layout.hpp"
#include "runtime/plan_record.hpp"
#include "runtime/step_driver.hpp"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace pf {

class SoapPlacement final : public KfacPlacement {
 public:
  // cost_scale: tests only (--test-kfac-cost-scale): the measured refreshes' costs scaled.
  SoapPlacement(const Config& cfg, const Layout& layout, const comm::Groups& groups, HostedChunks& chunks,
                double cost_scale);

  const std::vector<Action>& actions_for(int64_t step) const override;
  bool begin_step(int64_t step, const std::vector<MicroBatch>& mbs) override;
  void after_step(int64_t step, const std::vector<Action>& list, const std::vector<ActionTime>& times) override;
  int64_t plan_start() const override { return plan_start_; }
  int plan_period() const override;
  const PlanProfile* plan_profile() const override { return plan_ ? &profile_ : nullptr; }
  StepDriver& driver() override { return in_order_; }
  std::vector<TimedAction> planned_row(int64_t step) const override;
  std::optional<PlanSummary> plan_summary() const override;
  void save_state(nlohmann::json& j) const override;
  // UsageError naming --resume for a checkpoint without SOAP's plan state.
  void load_state(const nlohmann::json& j, const std::string& where, int64_t next_step) override;

  // Collective: rank 0 writes the refresh record of `steps` steps (this run's refreshes).
  void write_refresh_record(const std::string& path, int64_t steps) const;

 private:
  PlanProfile measured_profile() const;
  void check_recorded_weights() const;
  void make_plan();
  void plan_from(PlanProfile profile);

  PlanSettings settings_;
  const Layout& layout_;
  const comm::Groups& groups_;
  HostedChunks& chunks_;
  double scale_;
  int device_;
  const std::vector<Action>& lowered_;  // the device's lowered list: the profiling steps run it
  std::vector<double> action_ms_;       // [lowered action] summed over the profiling steps
  int samples_ = 0;
  int64_t plan_start_;
  std::unique_ptr<KfacPlan> plan_;
  PlanRecordRun record_run_;              // what soap_profile.json says of this run
  std::string out_dir_;
  std::optional<PlanProfile> recorded_;   // precond.plan_profile's, else none: this run's timings
  std::string recorded_path_;
  // The profile plan_ was made from (the same on every rank: all-reduced or recorded), kept for
  // checkpoints and soap_profile.json.
  PlanProfile profile_;
  std::vector<SoapRefresh> refreshes_;  // this rank's (replica 0's, pipeline 0's), as they ran
  InOrder in_order_;
};

}  // namespace pf
