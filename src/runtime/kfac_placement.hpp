#pragma once
// Where K-FAC's work runs in a training step (kfac.placement), behind one small interface. A
// step with K-FAC reads (train/mpi_run.cpp):
//
//   list = placement.actions_for(step);
//   stamps = placement.begin_step(step, micro-batches);   // each hosted chunk told its work
//   executor.run(step, list, ..., placement.driver());    // K-FAC kinds -> the units' handlers
//   placement.after_step(step, list, stamps);
//
// Two placements:
//   InlinePlacement (runtime/units/inline_placement.hpp)  kfac.placement = inline or skip: every
//       step runs the inline list; PREC refreshes on the critical path at the cadence's steps,
//       through the stage's DistributedKfac when the stage has copies.
//   Controller (runtime/pipefisher/controller.hpp)  kfac.placement = bubbles, PipeFisher: profile,
//       plan, the planned cycle, drift and re-planning; = adaptive, the same with the planned
//       units placed at run time by its step driver, FillingWaits (runtime/step_driver.hpp).
// make_placement (train/mpi_run.cpp's) builds one from the placement's spec (config/placement.hpp);
// check_kfac_placement (config/config.hpp) says which a layout allows.
#include "plan/plan_summary.hpp"
#include "runtime/action_time.hpp"
#include "schedule/schedule.hpp"
#include "sim/sim.hpp"
#include "core/micro_batch.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pf {

struct PlanProfile;  // sim/profile.hpp
class StepDriver;    // runtime/step_driver.hpp

class KfacPlacement {
 public:
  virtual ~KfacPlacement() = default;
  // The device's action list of step `step`.
  virtual const std::vector<Action>& actions_for(int64_t step) const = 0;
  // Step start: what each hosted chunk saves, taps and does at its PREC in this step. True when
  // after_step needs the step's stamps (the executor then takes them).
  virtual bool begin_step(int64_t step, const std::vector<MicroBatch>& mbs) = 0;
  // Step end, collective: `times` are the stamps of `list` (empty when begin_step said none).
  virtual void after_step(int64_t step, const std::vector<Action>& list, const std::vector<ActionTime>& times) = 0;

  // The refresh record's facts (kfac/refresh_record.hpp): the plan's first step and its period
  // (0: no plan).
  virtual int64_t plan_start() const = 0;
  virtual int plan_period() const = 0;
  // The PipeFisher profile the plan in use was made from (runtime/plan_record.hpp); null without.
  virtual const PlanProfile* plan_profile() const = 0;
  // How the executor runs each step's list (runtime/step_driver.hpp): in order, or (adaptive)
  // with the plan's units filling the waits.
  virtual StepDriver& driver() = 0;
  // The plan's timeline of this device's step `step` (plan/planned_row.hpp), for the profiler;
  // empty when the step follows no plan (profiling, draining, inline).
  virtual std::vector<TimedAction> planned_row(int64_t step) const { return {}; }
  // The plan in use; none without one (inline, skip, or before the first plan).
  virtual std::optional<PlanSummary> plan_summary() const { return std::nullopt; }

  // Checkpoints: the placement's own state, as JSON fields added to / read from `j` (the rank's
  // kfac_runtime metadata). load_state runs before the units' (the plan sets their splits);
  // next_step: the step the resumed run runs first.
  virtual void save_state(nlohmann::json& j) const = 0;
  virtual void load_state(const nlohmann::json& j, const std::string& where, int64_t next_step) = 0;
};

}  // namespace pf
