#pragma once
// PipeFisher's controller: kfac.placement = bubbles (and adaptive: the planned units then placed
// at run time by its step driver, FillingWaits, runtime/step_driver.hpp) in the MPI runtime
// (runtime/kfac_placement.hpp). It reads PipeFisher's typed options (pipefisher_options.hpp), not
// the Config; where its plan comes from is their PlanSource (plan_source.hpp).
// It decides which list each step runs and what each hosted chunk's units do in it, through these
// phases (runtime/README.md):
//
//   profiling   kProfileSteps steps run the inline list; every unit runs at PREC, timed
//               (controller.cpp: begin_step, after_step accumulating the profile)
//   planning    at the profile's end every rank all-reduces its timings (or takes the
//               recorded profile: the PlanSource) and calls the planner: the same bits give every
//               rank the same plan (controller_plan.cpp)
//   planned     step t runs plan.actions(replica, device, t - plan_start); a cycle begins where
//               the plan says
//   draining    forward/backward over 1.3x the profile for 3 steps on any rank (drift): each
//               device finishes its cycle, runs plain steps until every device's cycle boundary,
//               then all profile again and re-plan (controller.cpp: drift)
//
//   adapting    adaptive only (controller_adapt.cpp): at a cycle start of every device, at least
//               kAdaptSteps steps after the plan or the last look, every rank all-reduces what the
//               steps since measured and the planner plans again from it; a plan with other
//               refresh cycles (within kfac.min_refresh_steps .. kfac.max_refresh_steps) that
//               keeps the same factor splits, inversion owners and no more inline work is switched
//               to there by every rank (its first step runs the ended cycle's wrapped units first)
//
// Each field is written in one file: the phase and the profile in controller.cpp (after_step,
// which also moves plan_start to an adaptive switch, drift, and load_state restoring them from a
// checkpoint), the plan in use, its input, the switch to it and the profile's plan's cycles in
// controller_plan.cpp (plan_from_profile, make_plan, switch_plan, load_plan), the steady state in
// controller_adapt.cpp.
#include "comm/world.hpp"
#include "plan/planner.hpp"
#include "runtime/kfac_placement.hpp"
#include "runtime/layout.hpp"
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
  int64_t plan_start() const override { return phase_.plan_start; }
  int plan_period() const override;
  const PlanProfile* plan_profile() const override { return plan_ ? &plan_input_ : nullptr; }
  StepDriver& driver() override { return *driver_; }
  std::vector<TimedAction> planned_row(int64_t step) const override;
  void save_state(nlohmann::json& j) const override;
  void load_state(const nlohmann::json& j, const std::string& where) override;

 private:
  // Where the run is: profiling steps [profile_start, profile_start + kProfileSteps); the plan
  // made at their end runs its step 0 at plan_start. Draining: every device finishes its cycle
  // (its boundary), runs plain steps until replan_at, where all profile again.
  struct Phase {
    int64_t profile_start = 0, plan_start = kProfileSteps;
    int64_t boundary = -1, replan_at = -1;
    int drift_steps = 0;  // consecutive steps far over the profile
  };
  // The timings being summed: [lowered action] ms, and each chunk's units.
  struct Profile {
    std::vector<double> action_ms;
    int samples = 0;
    std::vector<ChunkKfacTimes> chunks;  // [hosted chunk]
  };
  // adaptive: what the planned steps since `since` (a cycle start of every device) measured, in
  // ms: the lowered actions the planner times, and each hosted chunk's K-FAC units by
  // (chunk, kind, layer) (-1 for PREC and SYNC_CURV; whole inversions only).
  struct Mean {
    double sum = 0;
    int n = 0;
  };
  struct Steady {
    int64_t since = 0;
    std::vector<Mean> actions;  // [lowered action]
    std::map<std::tuple<int, int, int>, Mean> units;
  };
  // adaptive: the step a re-plan switched at and its list (the ended cycle's wrapped units of the
  // previous plan, then the new plan's first step); -1: none.
  struct Switch {
    int64_t at = -1;
    std::vector<Action> first;
  };
  // A profiled step's list and, per entry, the lowered_ action it times (-1: an added PREC, or a
  // previous cycle's wrapped unit, which the profile does not count).
  struct ProfiledList {
    std::vector<Action> actions;
    std::vector<int> lowered_index;
  };
  // What this rank measured, as the planner takes it: its lowered actions' ms over the replicas
  // (those the planner measures, else 0), each hosted chunk's K-FAC units, the broadcast model
  // (ms, ms per byte; used when the profile has one).
  struct RankTimes {
    std::vector<double> actions;        // [lowered action]
    std::vector<StageKfacCost> chunks;  // [hosted chunk]
    std::pair<double, double> bcast = {0, 0};
  };
  bool profiling(int64_t t) const { return !plan_ || (t >= phase_.profile_start && t < phase_.profile_start + kProfileSteps); }
  const ProfiledList& profiled_list(int64_t t) const {
    return phase_.replan_at >= 0 && t == phase_.replan_at ? reprofile_first_ : inline_;
  }
  bool draining(int64_t t) const { return phase_.replan_at >= 0 && t >= phase_.boundary && t < phase_.replan_at; }
  void configure_chunk(HostedKfac& h, size_t index, int64_t step, float scale);
  void add_profile_step(int64_t step, const std::vector<Action>& list, const std::vector<ActionTime>& times);
  void check_drift(int64_t step, const std::vector<Action>& list, const std::vector<ActionTime>& times);
  void drift(int64_t step, double compute_ms);
  void drain_lists();
  // controller_adapt.cpp
  void restart_steady(int64_t since);
  void measure_steady(const std::vector<Action>& list, const std::vector<ActionTime>& times);
  bool adapt_due(int64_t step) const;
  bool adapt(int64_t step);  // true: switched to a re-plan at step + 1
  RankTimes steady_times() const;
  std::string not_adaptable(const KfacPlan& next) const;
  void save_adapt(nlohmann::json& j) const;
  void load_adapt(const nlohmann::json& j);
  // controller_plan.cpp
  RankTimes profiled_times();
  // Every rank's times all-reduced into the profile every rank plans from (the same bits).
  PlanProfile measured_profile(const RankTimes& mine, nlohmann::json shape, const char* what) const;
  void plan_from_profile();
  std::pair<double, double> bcast_model();
  std::unique_ptr<KfacPlan> plan_for(const PlanProfile& prof, double scale) const;
  void make_plan(bool restoring);
  void switch_plan(std::unique_ptr<KfacPlan> next, PlanProfile input, double scale, int64_t since, int64_t at);
  void load_switch(const nlohmann::json& j);
  void split_as_planned();
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
  ProfiledList reprofile_first_;        // a re-profile's first step: the cycle's wrapped units, then inline_
  Phase phase_;
  Profile profile_;
  std::unique_ptr<KfacPlan> plan_;
  PlanProfile plan_input_;  // the all-reduced profile the plan was made from
  double planned_compute_ms_ = 0;  // this rank's F/B/I/W per step in that profile (drift's yardstick)
  double plan_scale_ = 1.0;  // --test-kfac-cost-scale at planning
  std::optional<std::pair<double, double>> bcast_model_;  // W > 1: ms, ms per byte
  std::vector<Action> drain_first_, drain_plain_;
  std::vector<int> profiled_refresh_;   // [device] the plan from the profile's cycles (adaptive's default bound)
  Steady steady_;
  Switch switch_;
};

}  // namespace pf
