#pragma once
// PipeFisher's controller: kfac.placement = bubbles (and adaptive: the planned units then placed
// at run time by its step driver, FillingWaits, runtime/step_driver.hpp) in the MPI runtime
// (runtime/kfac_placement.hpp). It reads PipeFisher's typed options (pipefisher_options.hpp), not
// the Config; where its plan comes from is their PlanSource (plan_source.hpp).
// It decides which list each step runs and what each hosted chunk's units do in it, through these
// phases, each a small state type (phases.hpp; runtime/README.md):
//
//   Profiling   kProfileSteps steps run the inline list; every unit runs at PREC, timed; at the
//               last, every rank all-reduces its timings (or takes the recorded profile: the
//               PlanSource) and calls the planner: the same bits give every rank the same plan
//               (controller_plan.cpp)
//   Planned     step t runs plan.actions(replica, device, t - plan_start); a cycle begins where
//               the plan says
//   Draining    forward/backward over 1.3x the profile for 3 steps on any rank (drift): each
//               device finishes its cycle, runs plain steps until every device's cycle boundary,
//               then all profile again and re-plan
//   Switching   adaptive only (controller_adapt.cpp): at a cycle start of every device, at least
//               kAdaptSteps steps after the plan or the last look, every rank all-reduces what the
//               steps since measured and the planner plans again from it; a plan with other
//               refresh cycles (within kfac.min_refresh_steps .. kfac.max_refresh_steps) that
//               keeps the same factor splits, inversion owners and no more inline work is switched
//               to there by every rank (its first step runs the ended cycle's wrapped units first)
//
// Each field is written in one file: the phase in controller.cpp (after_step sets it to what the
// phase's step end returns, controller_phases.cpp; load_state), the profile (and each chunk's
// ChunkMeasures::profiled) in controller_phases.cpp, the plan in use, its input and the profile's
// plan's cycles in controller_plan.cpp, the steady state (and each chunk's ChunkMeasures::steady)
// in controller_adapt.cpp.
#include "comm/world.hpp"
#include "plan/planner.hpp"
#include "runtime/kfac_placement.hpp"
#include "runtime/layout.hpp"
#include "runtime/pipefisher/phases.hpp"
#include "runtime/pipefisher/pipefisher_options.hpp"
#include "runtime/seams.hpp"
#include "runtime/step_driver.hpp"
#include "runtime/units/kfac_units.hpp"
#include "sim/profile.hpp"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace pf {

// adaptive: the fewest steps measured before the refresh cycles may change.
inline constexpr int kAdaptSteps = 6;

class Controller final : public KfacPlacement {
 public:
  // driver: how the executor runs each step's list (in order: bubbles; filling waits: adaptive).
  // seams: tests only (runtime/seams.hpp): drift forced, unit costs scaled, a fixed broadcast model.
  Controller(PipeFisherOptions options, std::unique_ptr<StepDriver> driver, const Layout& layout,
             const comm::Groups& groups, KfacUnits& units, const KfacSeams& seams);

  const std::vector<Action>& actions_for(int64_t step) const override;
  bool begin_step(int64_t step, const std::vector<MicroBatch>& mbs) override;
  void after_step(int64_t step, const std::vector<Action>& list, const std::vector<ActionTime>& times) override;
  int64_t plan_start() const override;
  int plan_period() const override;
  const PlanProfile* plan_profile() const override { return plan_ ? &plan_input_ : nullptr; }
  std::optional<PlanSummary> plan_summary() const override;
  StepDriver& driver() override { return *driver_; }
  std::vector<TimedAction> planned_row(int64_t step) const override;
  void save_state(nlohmann::json& j) const override;
  void load_state(const nlohmann::json& j, const std::string& where, int64_t next_step) override;

 private:
  // The timings being summed: [lowered action] ms (each chunk's units: ChunkMeasures::profiled).
  struct Profile {
    std::vector<double> action_ms;
    int samples = 0;
  };
  // adaptive: what the planned steps since `since` (a cycle start of every device) measured, in
  // ms: the lowered actions the planner times (each chunk's units: ChunkMeasures::steady).
  struct Mean {
    double sum = 0;
    int n = 0;
  };
  struct Steady {
    int64_t since = 0;
    std::vector<Mean> actions;  // [lowered action]
  };
  // One record per hosted chunk (by its place in units_.hosted()): what this rank measured of its
  // K-FAC units. profiled: the profiling steps' sums (ChunkKfac times them at PREC);
  // steady: adaptive's means since Steady::since by (kind, layer) (-1 for PREC and SYNC_CURV;
  // whole inversions only).
  struct ChunkMeasures {
    ChunkKfacTimes profiled;
    std::map<std::pair<int, int>, Mean> steady;
  };
  // What this rank measured, as the planner takes it: its lowered actions' ms over the replicas
  // (those the planner measures, else 0), each hosted chunk's K-FAC units, the broadcast model
  // (ms, ms per byte; used when the profile has one).
  struct RankTimes {
    std::vector<double> actions;        // [lowered action]
    std::vector<StageKfacCost> chunks;  // [hosted chunk]
    std::pair<double, double> bcast = {0, 0};
  };
  // controller_phases.cpp: each phase's steps (their lists, the plan's step they run, if any)
  // and step ends (the next phase).
  const ProfiledList& profiled(const Profiling& p, int64_t t) const { return t == p.start ? p.first : inline_; }
  const std::vector<Action>& list(const Profiling& p, int64_t t) const { return profiled(p, t).actions; }
  const std::vector<Action>& list(const Planned& p, int64_t t) const;
  const std::vector<Action>& list(const Draining& p, int64_t t) const;
  const std::vector<Action>& list(const Switching& p, int64_t) const { return p.first; }
  std::optional<int64_t> plan_step(const Profiling&, int64_t) const { return std::nullopt; }
  std::optional<int64_t> plan_step(const Planned& p, int64_t t) const { return t - p.plan_start; }
  std::optional<int64_t> plan_step(const Draining& p, int64_t t) const;
  std::optional<int64_t> plan_step(const Switching& p, int64_t t) const { return t - p.at; }
  Phase after(Profiling p, int64_t step, const std::vector<Action>& list, const std::vector<ActionTime>& times);
  Phase after(Planned p, int64_t step, const std::vector<Action>& list, const std::vector<ActionTime>& times);
  Phase after(Draining p, int64_t step, const std::vector<Action>& list, const std::vector<ActionTime>& times);
  Phase after(Switching p, int64_t step, const std::vector<Action>& list, const std::vector<ActionTime>& times);
  Profiling profiling(int64_t start, int64_t plan_start, int64_t drained_boundary) const;
  void add_profile_step(const Profiling& p, int64_t step, const std::vector<Action>& list,
                        const std::vector<ActionTime>& times);
  std::optional<Draining> check_drift(Planned& p, int64_t step, const std::vector<Action>& list,
                                      const std::vector<ActionTime>& times);
  std::optional<Draining> drift(Planned& p, int64_t step, double compute_ms);
  Draining draining(int64_t plan_start, int64_t boundary, int64_t replan_at) const;
  Phase settle(Draining d, int64_t next) const;  // Profiling when the drain ends before `next`
  void save_profile(nlohmann::json& j) const;
  void load_profile(const nlohmann::json& j);
  // controller.cpp: the phase in checkpoints.
  PhaseRecord record_of(const Phase& phase) const;
  Phase phase_of(const PhaseRecord& r, int64_t t) const;
  // controller_adapt.cpp
  void restart_steady(int64_t since);
  void measure_steady(const std::vector<Action>& list, const std::vector<ActionTime>& times);
  bool adapt_due(int64_t step, int64_t plan_start) const;
  // The switching step's list when the run switches to a re-plan at step + 1.
  std::optional<std::vector<Action>> adapt(int64_t step);
  RankTimes steady_times() const;
  std::string not_adaptable(const KfacPlan& next) const;
  void save_adapt(nlohmann::json& j) const;
  void load_adapt(const nlohmann::json& j, int64_t plan_start);
  // controller_plan.cpp
  RankTimes profiled_times();
  // Every rank's times all-reduced into the profile every rank plans from (the same bits).
  PlanProfile measured_profile(const RankTimes& mine, nlohmann::json shape, const char* what) const;
  void plan_from_profile(int64_t profile_start, int64_t plan_start);
  std::pair<double, double> bcast_model();
  std::unique_ptr<KfacPlan> plan_for(const PlanProfile& prof, double scale) const;
  void make_plan();
  std::vector<Action> switch_plan(std::unique_ptr<KfacPlan> next, PlanProfile input, double scale, int64_t since,
                                  int64_t at);
  void load_profiled_refresh(const nlohmann::json& j);
  void split_as_planned(int64_t plan_start);
  void split_preconditions();
  void save_plan(nlohmann::json& j) const;
  void load_plan(const nlohmann::json& j, const std::string& where);

  const PipeFisherOptions opts_;
  std::unique_ptr<StepDriver> driver_;
  const Layout& layout_;
  const comm::Groups& groups_;
  KfacUnits& units_;
  KfacSeams seams_;
  int device_;
  const std::vector<Action>& lowered_;  // the device's lowered list (what the profile times)
  ProfiledList inline_;                 // lowered + each chunk's PREC before the first OPT
  Phase phase_;
  Profile profile_;
  std::unique_ptr<KfacPlan> plan_;
  PlanProfile plan_input_;  // the all-reduced profile the plan was made from
  double planned_compute_ms_ = 0;  // this rank's F/B/I/W per step in that profile (drift's yardstick)
  double plan_scale_ = 1.0;  // --test-kfac-cost-scale at planning
  std::optional<std::pair<double, double>> bcast_model_;  // W > 1: ms, ms per byte
  std::vector<int> profiled_refresh_;   // [device] the plan from the profile's cycles (adaptive's default bound)
  Steady steady_;
  std::vector<ChunkMeasures> chunks_;  // [hosted chunk], sized once
};

}  // namespace pf
