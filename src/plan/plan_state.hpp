#pragma once
// The planner's internal state (planner.cpp runs the passes; plan_w.cpp, plan_prec.cpp,
// plan_units.cpp, plan_pack.cpp and plan_emit.cpp hold them). Not part of the planner's interface:
// plan/planner.hpp is.
//
// One PlanState flows through the passes in order; each pass reads what earlier passes wrote
// and writes only its own fields (the comment of each field names the pass that writes it).
#include "plan/planner.hpp"

#include <climits>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace pf::plan {

constexpr double kEps = 1e-9;
constexpr double kMinCollective = 1e-6;  // shortest broadcast unit (time units of the input)
constexpr int kNoReplica = -2;           // a unit owned by another holder of its stage (Chimera group)

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
  double margin = 0;
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
};

struct PlanState {
  explicit PlanState(const PlanInput& input);
  PlanInput in;                                 // the input, its optimizer steps set aside (set_aside_optimizer)
  std::vector<std::vector<Action>> optimizer;   // [device] OPTs, in order (set_aside_optimizer)
  TimedSchedule step;                           // the step before K-FAC, zero-bubble W moved (place_weight_gradients)
  // The result. Its fields by writer: devices, replicas, step_template: the constructor;
  // weight_gradients: place_weight_gradients; prec_splits: split_precondition; plain_step_time,
  // base, base_step_time: place_precondition;
  // strategy: pack_by_strategy; refresh_steps, common_cycle, sync_steps, sync_step, step0,
  // step0_time: set_cycle_lengths; its lists (units(), actions(), wrapped()), kfac_work,
  // device_inline, utilization_per_device, splits, placements: emit_lists; bubble,
  // precondition, lower_bound_refresh_steps, utilization, inline_time, step_time: measure.
  KfacPlan plan;
  TimedSchedule base;                           // the step with PREC (place_precondition)
  // [device] the smallest largest gap among the devices sharing a stage with it: the split and
  // inline threshold (place_precondition)
  std::vector<double> largest_shared_gap;
  std::vector<DeviceUnits> device_units;        // [device] (make_units)
  std::vector<CycleStep0> cycle_step0;          // [replica] (build_cycle_step0)
  bool any_inline = false;                      // (build_cycle_step0)
  std::vector<CollectivePin> pins;              // [device] (pin_collectives)
  std::vector<PackedDevice> packed;             // [device] (pack_by_strategy)

  int devices() const { return in.schedule.devices; }
  int replicas() const { return in.replicas; }
  bool chimera() const { return in.schedule.pipelines > 1; }
  bool per_pair() const { return in.chimera_group && chimera(); }  // Chimera's stage groups
};

// The passes, in order (planner.cpp).
void set_aside_optimizer(PlanState& state);
void place_weight_gradients(PlanState& state);
void split_precondition(PlanState& state);
void place_precondition(PlanState& state);
void make_units(PlanState& state);
void build_cycle_step0(PlanState& state);
void pin_collectives(PlanState& state);
void pack_by_strategy(PlanState& state);
void set_cycle_lengths(PlanState& state);
void emit_lists(PlanState& state);
void measure(PlanState& state);

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
