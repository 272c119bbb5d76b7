#pragma once
// The planner's internal state (planner.cpp runs the passes; plan_units.cpp, plan_pack.cpp and
// plan_emit.cpp hold them). Not part of the planner's interface: plan/planner.hpp is.
//
// One PlanState flows through the passes; each reads what earlier passes wrote and adds its
// own fields (the comment of each field names the pass that writes it).
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

// A schedule with per-action durations, edited by inserting actions.
struct TimedSchedule {
  Schedule s;
  std::vector<std::vector<double>> dur;
  void insert(int d, int at, const Action& a, double t);
  Timeline simulate() const;
};

// One K-FAC unit of a device, before placement.
struct Unit {
  Action a;
  double dur = 0;
  double ready = 0;        // from the step's own F/B (curvature), 0 otherwise
  std::vector<int> deps;   // earlier units of the device
  int owner = -1;          // replica running it (-1 = every replica, kNoReplica: another device)
  bool inl = false;
  bool pinned = false;     // Chimera: at the end of cycle step K (syncs, then inline inversions)
};
bool runs_on(const Unit& x, int w);

const StageKfacCost& stage_cost(const PlanInput& in, int s);  // in.kfac's entry for stage s
int holder_count(const PlanInput& in);  // holders of a stage: W replicas (x 2 with Chimera's group)
// The holders of stage s (pipeline p's copy), member p' * W + w: (device, replica); with
// Chimera's group both pipelines' copies, the same list for either p.
std::vector<std::pair<int, int>> stage_members(const PlanInput& in, int p, int s);

struct DeviceUnits {
  int device = 0;
  std::vector<Unit> units;
  std::vector<std::pair<int, int>> stages;  // hosted (pipeline, stage), by first forward
  std::vector<StagePlacement> placements;   // several holders (place_inversions)
};

// (pipeline, stage, side, layer) -> blocks for inversions that would run whole (the "split when
// it shortens the refresh period" policy of pack_by_strategy).
using ForcedSplits = std::map<std::tuple<int, int, int, int>, int>;

// Greedy fit of one replica's gap units over consecutive steps. Absolute times from the cycle
// start: step 0 from `step0`, step k >= 1 from `base` shifted. With a period R > 0 (Chimera's
// group) steps k >= R are the next cycle's steps k - R: their gaps are the same gaps (one cursor,
// kept relative to the step), step 0's leading gap included, and nothing goes beyond step
// max_step (place returns gap -1).
struct Placer {
  const Timeline& step0;
  const Timeline& base;
  int d;
  double margin;
  int period = 0, max_step = INT_MAX;
  struct G {
    Gap g;
    int step;
    int phys;       // the gap whose cursor this one shares (itself unless an alias)
    double cursor;  // relative to its step's start (physical gaps only)
    double kept = 0;  // room kept at its end (physical gaps only; keep_room)
  };
  std::vector<G> gaps;
  int steps = 0;

  double offset(int k) const { return k == 0 ? 0 : step0.step_time + (k - 1) * base.step_time; }
  void add_step();
  double cursor(const G& g) const { return gaps[g.phys].cursor + offset(g.step); }
  // (gap index, absolute start), or (-1, 0) past max_step. First fit: the earliest gap that
  // takes the unit; best fit: in the earliest step that has such a gap, the one left with the
  // least room. keep: the unit leaves the room kept in its gap (keep_room) free.
  std::pair<int, double> place(double ready, double dur, bool best_fit, bool keep = false);
  // Keeps room for `count` units of length `size` at the ends of the gaps of steps 0..steps-1,
  // the latest gaps first, at most `per_gap` in one gap.
  void keep_room(int steps, double size, int count, int per_gap);
};

// A packing of a device's units (plan_pack.cpp): priority classes always in order; within a
// class by readiness or largest first, first or best fit, chosen separately for curvature (and
// sync) and for inversion.
struct Strategy {
  bool curv_largest_first, curv_best_fit;  // curvature and sync
  bool inv_largest_first, inv_best_fit;    // inversion
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

// One replica's cycle step 0 (the step with PREC plus its inline units) and its packing.
struct ReplicaState {
  TimedSchedule step0;
  Timeline tl0;
  std::vector<std::vector<std::pair<int, int>>> inline_at;  // [device] (unit, index in step0)
  std::vector<std::vector<int>> gap_of;                     // [device][unit] gap index or -1
  std::vector<std::vector<double>> start;                   // [device][unit] absolute start
  std::vector<Placer> placers;                              // [device]
  std::vector<int> needed;                                  // [device] steps needed
};

// One packing of one replica's device (pack_by_strategy tries several).
struct DevicePlacement {
  Placer placer;
  std::vector<int> gap_of;
  std::vector<double> start;
  int needed = 1;
};

struct PlanState {
  explicit PlanState(const PlanInput& input) : in(input) {}
  PlanInput in;                                   // the input, its optimizer steps set aside
  std::vector<std::vector<Action>> optimizer;     // [device] OPTs, in order (set_aside_optimizer)
  KfacPlan plan;                                  // the result, filled pass by pass
  // plan.prec_splits: split_precondition; plan.plain_step_time, base, base_step_time: place_precondition
  TimedSchedule base;                             // the step with PREC (place_precondition)
  std::vector<double> decide_gap;                 // [device] split / inline threshold (place_precondition)
  std::vector<DeviceUnits> du;                    // [device] units (make_units, place_inversions)
  std::vector<ReplicaState> rs;                   // [replica] (build_cycle_step0, pack_by_strategy)
  bool any_inline = false;                        // (build_cycle_step0)
  std::vector<int> sync_steps;                    // [device] Chimera: cycle step K (pin_collectives)
  std::vector<int> period_of;                     // [device] Chimera group: R for wrapped inversions (pack_by_strategy)

  int devices() const { return in.schedule.devices; }
  int replicas() const { return in.replicas; }
  bool chimera() const { return in.schedule.pipelines > 1; }
  bool per_pair() const { return in.chimera_group && chimera(); }  // Chimera's stage groups
};

// The passes, in order (planner.cpp).
void set_aside_optimizer(PlanState& st);
void split_precondition(PlanState& st);
void place_precondition(PlanState& st);
void make_units(PlanState& st);
void place_inversions(PlanState& st);
void build_cycle_step0(PlanState& st);
void pin_collectives(PlanState& st);
void pack_by_strategy(PlanState& st);
void set_cycle_lengths(PlanState& st);
void emit_lists(PlanState& st);
void measure(PlanState& st);

// PREC(p, s) on device d: its busiest replica's share of a split precondition, or the whole.
double precondition_time(const PlanState& st, int d, int p, int s);

// Per-device pieces the passes share (split_to_shorten re-runs them on trial splits).
DeviceUnits make_device_units(const PlanInput& in, const Timeline& step, int d, double max_gap,
                              std::vector<FactorSplit>& splits, const ForcedSplits& force = {});
void place_device_inversions(const PlanInput& in, DeviceUnits& du, double max_gap);

}  // namespace pf::plan
