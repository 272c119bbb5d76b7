#pragma once
// The planner's internal state (planner.cpp runs the passes; plan_w.cpp, plan_prec.cpp,
// plan_units.cpp, plan_pack.cpp and plan_emit.cpp hold them). Not part of the planner's interface:
// plan/planner.hpp is.
//
// One PlanState flows through the passes in order; each pass reads what earlier passes stored
// and returns its own output, which run_pass stores in the pass's field.
#include "plan/planner.hpp"
#include "schedule/kfac_graph.hpp"

#include <climits>
#include <cstddef>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace pf::plan {

constexpr double kEps = 1e-9;
constexpr double kMinCollective = 1e-6;  // shortest broadcast unit (time units of the input)
constexpr int kNoReplica = -2;           // a unit owned by another holder of its stage (Chimera group)

// The fit rule (sim/fit.hpp) with the input's margin, up to the rounding of the planner's sums.
inline Fit gap_fit(const PlanInput& in) { return {in.margin, kEps}; }

// The gaps K-FAC units go into are Timeline::gaps (sim/sim.hpp: the one definition of a gap).

// A schedule with per-action durations, edited by inserting actions. `local[d][i]`: action i of
// device d is a collective run by one replica alone (an inline curvature sync or broadcast): the
// simulator times it as device work after the stage's gradients, as it times the stage's PREC,
// and does not group it with the same collective of another device.
struct TimedSchedule {
  Schedule schedule;
  std::vector<std::vector<double>> durations = {};
  std::vector<std::vector<char>> local = {};
  // Point-to-point message times between stages (PlanInput::cost: a profile's; none with measured
  // durations, which hold the waits): the same step as the plain simulation.
  CostModel links = {};
  void insert(int device, int at, const Action& action, double duration, bool replica_local = false);
  Timeline simulate() const;  // the actions keep their kinds in the timeline
};

// One K-FAC unit of a device, before placement.
struct Unit {
  Action action;
  double duration = 0;
  double ready = 0;        // from the step's own F/B (curvature), 0 otherwise
  std::vector<int> deps;   // earlier units of the device
  int owner = -1;          // replica running it (-1 = every replica, kNoReplica: another device)
  bool runs_inline = false;  // no gap takes it: in cycle step 0 before its stage's PREC
  bool pinned = false;     // Chimera: at the end of cycle step K (syncs, then inline inversions)
};
bool runs_on(const Unit& unit, int replica);

const StageKfacCost& stage_cost(const PlanInput& in, int stage);  // in.kfac's entry for the stage
int holder_count(const PlanInput& in);  // holders of a stage: W replicas (x 2 with Chimera's group)
// The holders of stage s (pipeline p's copy), member p' * W + w: (device, replica); with
// Chimera's group both pipelines' copies, the same list for either p.
std::vector<std::pair<int, int>> stage_members(const PlanInput& in, int pipeline, int stage);

// (pipeline, stage, side, layer) -> blocks for inversions that would run whole (the "split when
// it shortens the refresh period" policy of pack_by_strategy).
using ForcedSplits = std::map<std::tuple<int, int, int, int>, int>;

// A device's K-FAC units in priority order, with the placement of its stages' inversions over
// their holders and the factors it splits into diagonal blocks.
struct DeviceUnits {
  int device = 0;
  std::vector<Unit> units;
  std::vector<std::pair<int, int>> stages;  // hosted (pipeline, stage), by first forward
  std::vector<StagePlacement> placements;   // several holders (place_device_inversions)
  std::vector<FactorSplit> splits;          // factors run as diagonal blocks
};

// Greedy fit of one replica's gap units over consecutive steps. Absolute times from the cycle
// start: step 0 from `step0`, step k >= 1 from `base` shifted. With a period R > 0 (Chimera's
// group) steps k >= R are the next cycle's steps k - R: their gaps are the same gaps (one cursor,
// kept relative to the step), step 0's leading gap included, and nothing goes beyond step
// max_step (place returns gap -1).
struct Placer {
  const Timeline& step0;
  const Timeline& base;
  int device = 0;
  Fit fit = {};
  int period = 0, max_step = INT_MAX;
  struct StepGap {
    Gap gap;
    int step = 0;
    int cursor_gap = 0;  // the gap whose cursor this one shares (itself unless the next cycle's copy)
    double cursor = 0;   // relative to its step's start (cursor gaps only)
    double kept = 0;     // room kept at its end (cursor gaps only; keep_room)
  };
  std::vector<StepGap> gaps = {};
  int steps = 0;

  double offset(int k) const { return k == 0 ? 0 : step0.step_time + (k - 1) * base.step_time; }
  void add_step();
  double cursor(const StepGap& g) const { return gaps[g.cursor_gap].cursor + offset(g.step); }
  // (gap index, absolute start), or (-1, 0) past max_step. First fit: the earliest gap that
  // takes the unit; best fit: in the earliest step that has such a gap, the one left with the
  // least room. keep: the unit leaves the room kept in its gap (keep_room) free.
  std::pair<int, double> place(double ready, double duration, bool best_fit, bool keep = false);
  // Keeps room for `count` units of length `size` at the ends of the gaps of steps 0..steps-1,
  // the latest gaps first, at most `per_gap` in one gap.
  void keep_room(int steps, double size, int count, int per_gap);
};

// A packing of a device's units (plan_pack.cpp): priority classes always in order; within a
// class by readiness or largest first, first or best fit, chosen separately for curvature (and
// sync) and for inversion.
struct Strategy {
  bool curv_largest_first = false, curv_best_fit = false;  // curvature and sync
  bool inv_largest_first = false, inv_best_fit = false;    // inversion
  // Room kept for the device's largest inversions while curvature and collectives are placed
  // (curvature ready early would fill the long gaps, and the inversions no shorter gap holds
  // would wait for later steps): 0 none; 1 for each of them, in the latest gaps of the steps the
  // work needs at least (of the period with Chimera's group); 2 one in every gap of those steps.
  int reserve = 0;
  // Gap by gap instead of unit by unit: each gap in time order takes, while one fits, the largest
  // ready unit (the orders and fits above do not apply; the classes still order equal units).
  bool gap_first = false;
  bool largest_first(Kind k) const;
  bool best_fit(Kind k) const;
  std::string name() const;
};

// One replica's cycle step 0: the step with PREC plus its inline units.
struct CycleStep0 {
  TimedSchedule step;
  Timeline timeline;
  std::vector<std::vector<std::pair<int, int>>> inline_at;  // [device] (unit, index in step)
};

// One packing of one replica's device (pack_by_strategy tries several).
struct DevicePlacement {
  Placer placer;
  std::vector<int> gap_of;     // [unit] gap index or -1
  std::vector<double> start;   // [unit] absolute start
  int needed = 1;              // steps needed
};

// Where a device's collectives sit in its cycle (pin_collectives).
struct CollectivePin {
  int sync_step = -1;  // Chimera: the cycle step whose end holds the syncs; -1: none
  int period = 0;      // Chimera's group: the overlapped cycle R of wrapped inversions; 0: none
};

// A device as packed: its units (split to shorten, or make_units' own), the packing of each
// replica, the strategy's name.
struct PackedDevice {
  DeviceUnits units;
  std::vector<DevicePlacement> replicas;  // [replica]
  bool split_to_shorten = false;          // units split by pack_by_strategy's policy
  std::string strategy = {};              // the packing used (KfacPlan::strategy)
};

// set_aside_optimizer: the input without its optimizer steps, and those steps.
struct OptimizerSetAside {
  PlanInput in;
  std::vector<std::vector<Action>> optimizer;  // [device] OPTs, in order
};

// place_weight_gradients: the step before K-FAC, timed, zero-bubble W moved.
struct WeightGradientStep {
  TimedSchedule timed;
  WeightGradientMoves moves;
};

// place_precondition: the step with PREC, which every K-FAC unit is placed around.
struct BaseStep {
  TimedSchedule timed;
  Timeline timeline;             // what the gaps are taken from
  double plain_step_time = 0;    // the same step without PREC
  // [device] the smallest largest gap among the devices sharing a stage with it: the split and
  // inline threshold
  std::vector<double> largest_shared_gap;
};

// set_cycle_lengths: each device's refresh cycle.
struct Cycles {
  std::vector<int> refresh_steps;  // [device]
  bool common_cycle = false;
  std::vector<int> sync_steps;     // [device] (pins)
  int sync_step = -1;
  Timeline step0;                  // replica 0's cycle step 0
  double step0_time = 0;           // the longest replica's
};

// emit_lists: the lists and what each device's units cost per cycle (busiest replica).
struct EmittedLists {
  PlanLists lists;
  std::vector<double> kfac_work, device_inline, utilization_per_device;  // [device]
};

// measure: bubble, precondition and bounds per device, the step.
struct Measures {
  std::vector<double> bubble, precondition;  // [device]
  std::vector<int> lower_bound_refresh_steps;
  double utilization = 0, inline_time = 0, step_time = 0;
};

// The planner's passes run in order over one PlanState (planner.cpp). A pass reads the state
// and returns its output; run_pass stores it in the pass's field. No pass can write the state
// (it gets it const), so each field has one writer by type; assemble builds the KfacPlan once
// from the fields.
struct PlanState {
  explicit PlanState(const PlanInput& input);  // in and optimizer: set_aside_optimizer
  PlanInput in;                                // the input, its optimizer steps set aside
  std::vector<std::vector<Action>> optimizer;  // [device] OPTs, in order
  WeightGradientStep step;                     // place_weight_gradients
  std::vector<PrecSplit> prec_splits;          // split_precondition: several holders, each (pipeline, stage)
  BaseStep base;                               // place_precondition
  std::vector<DeviceUnits> device_units;       // [device] make_units
  std::vector<CycleStep0> cycle_step0;         // [replica] build_cycle_step0
  std::vector<CollectivePin> pins;             // [device] pin_collectives
  std::vector<PackedDevice> packed;            // [device] pack_by_strategy
  Cycles cycles;                               // set_cycle_lengths
  EmittedLists emitted;                        // emit_lists
  Measures measures;                           // measure

  int devices() const { return in.schedule.devices; }
  int replicas() const { return in.replicas; }
  bool chimera() const { return in.schedule.pipelines > 1; }
  bool per_pair() const { return in.chimera_group && chimera(); }  // Chimera's stage groups
  bool any_inline() const;  // a cycle step 0 has inline units
};

// The passes, in order (planner.cpp), each returning its field of PlanState.
OptimizerSetAside set_aside_optimizer(const PlanInput& input);  // PlanState's constructor
WeightGradientStep place_weight_gradients(const PlanState& state);
std::vector<PrecSplit> split_precondition(const PlanState& state);
BaseStep place_precondition(const PlanState& state);
std::vector<DeviceUnits> make_units(const PlanState& state);
std::vector<CycleStep0> build_cycle_step0(const PlanState& state);
std::vector<CollectivePin> pin_collectives(const PlanState& state);
std::vector<PackedDevice> pack_by_strategy(const PlanState& state);
Cycles set_cycle_lengths(const PlanState& state);
EmittedLists emit_lists(const PlanState& state);
Measures measure(const PlanState& state);

// The passes by name, in order, and the one place their outputs are stored.
enum class Pass {
  place_weight_gradients, split_precondition, place_precondition, make_units, build_cycle_step0,
  pin_collectives, pack_by_strategy, set_cycle_lengths, emit_lists, measure
};
constexpr Pass kPasses[] = {Pass::place_weight_gradients, Pass::split_precondition, Pass::place_precondition,
                            Pass::make_units, Pass::build_cycle_step0, Pass::pin_collectives,
                            Pass::pack_by_strategy, Pass::set_cycle_lengths, Pass::emit_lists, Pass::measure};
// The first kBasePasses build the base step (the step with PREC), the rest place K-FAC around it:
// PrecPlacement::best runs the rest once per base step.
constexpr size_t kBasePasses = 3;
void run_pass(PlanState& state, Pass pass);
// The plan from a state every pass has run over (moved from).
KfacPlan assemble(PlanState&& state);

// PREC(p, s) on device d: its busiest replica's share of a split precondition, or the whole.
double precondition_time(const PlanState& state, int device, int pipeline, int stage);

// Device d's units: curvature, sync and inversion (make_device_units), the inversions of each
// stage placed over its holders with their broadcasts (place_device_inversions). make_units
// runs it per device; pack_by_strategy again with forced splits.
DeviceUnits device_units(const PlanInput& in, const Timeline& step, int device, double max_gap,
                         const ForcedSplits& force = {});
DeviceUnits make_device_units(const PlanInput& in, const Timeline& step, int device, double max_gap,
                              const ForcedSplits& force = {});
void place_device_inversions(const PlanInput& in, DeviceUnits& units, double max_gap);

}  // namespace pf::plan
