#pragma once
// The PipeFisher planner: places K-FAC work (curvature, curvature sync, inversion, precondition)
// into the bubbles of any pipeline schedule (paper section 3.1), shared by the runtime and
// `pipefisher plan --kfac`.
//
// Usage (runtime):
//   PlanInput in = plan_input(layout.schedule,      // one step, compute-only or lowered
//                             settings,             // W replicas, margin, ... (PlanSettings)
//                             {alpha, beta},        // the broadcast model
//                             measured, scale);     // [stage] measured per-unit durations
//   in.durations = measured_ms;                     // [device][index] ms, same shape (or empty:
//                                                   //  durations from in.cost)
//   KfacPlan plan = plan_kfac(in);
//   for each step t:  run plan.actions(replica, device, t)   // F/B/comm + K-FAC + OPT, in order
//   and call set_blocks(k) once for every plan.splits() entry (block-diagonal factor).
// The plan answers the runtime's other questions: inverter(piece) (who inverts and broadcasts
// it), wrapped(replica, device, k) (the previous cycle's units of cycle step k), cycle starts,
// a drain's plain list, split_blocks, and profiling_actions (the inline list before any plan).
// The runtime never edits or filters its lists.
//
// How the planner is built: a pipeline of passes over one state (planner.cpp lists them and
// says where run-time gap filling would slot in).
//
// Rules (paper 3.1, as its code does them):
//   Zero-bubble W first (the step's gradient; place_weight_gradients): every W, in its device's
//   order (the output gradients kept for W are freed first in, first out), moves to the earliest
//   gap of the step's timeline after its I and the device's previous W where
//   duration * (1 + margin) fits from max(gap start, ready), never later than the schedule put
//   it; the step is re-timed after each move. The K-FAC units below fill what W leaves.
//   The K-FAC units and what each reads are the K-FAC graph's (schedule/kfac_graph.hpp: CURV_A
//   after its F, CURV_B after its B or I, SYNC_CURV (several holders) after the stage's
//   curvature, INV_A/B after its factor's curvature and the sync). PREC(p,s) every step after
//   the stage's last backward (and its ALLREDUCE), before its OPT: in the first gap after that
//   which fits, else at the device's end
//   (PlanInput::precondition; a stage whose last backward ends before the step does, as the later
//   stages of GPipe and 1F1B, has it in that tail gap either way). With several holders (replicas,
//   Chimera's twins) each holder's PREC preconditions its share of the stage's layers and the
//   holders all-gather the results (PrecSplit).
//   Priorities: CURV_A, CURV_B, SYNC, INV_A, INV_B; within a kind, by readiness then layer.
//   A unit fits a gap if duration * (1 + margin) <= the gap's free time from max(cursor, ready)
//   (sim/fit.hpp, the one fit rule).
//   What does not fit goes to the gaps of the following steps (copies of the step). The paper's
//   greedy first fit is tried first; a few other deterministic packings (largest first within a
//   class, best fit within the earliest step) are tried too and the one needing the fewest steps
//   is kept per device (`strategy`): on BERT-Large 1F1B D=N=8 first fit needs 3 steps on
//   devices 0 and 1, where 2 suffice.
//
// Refresh cycle. Curvature always uses the micro-batches of the first step of a device's cycle
// (their activations and errors are kept: M_err^save). A device needs refresh_steps[d] = R steps:
// its units sit in the gaps of cycle steps 0..R-1, and may also use the leading gap of step R
// (before any F of that step, where nothing of the new cycle can run): those "wrapped" units are
// listed at the start of cycle step 0 and run from the second cycle on (actions() omits them in
// the first cycle; Chimera's group wraps further, see below). Each device repeats its own cycle: step t runs cycle step t % R_d; data-
// parallel replicas of a device share R_d (their SYNC_CURVs meet). If any unit runs inline, all
// devices share one cycle length (the step-0 timeline with inline work is then the one that runs).
//
// Staleness. Until an inverse is refreshed the previous one is used. With W = 1 a PREC uses
// whatever inverse its device holds at that point of its order.
//
// W > 1 (or Chimera's group): the inversion units of a stage (whole factors, or the diagonal
// blocks of a split one) are placed over its replicas (holders) by SPD-KFAC's Algorithm 1
// (place_load_balanced, kfac/placement.hpp): by dimension, largest first; a unit whose inversion time (its planned duration) is below the
// broadcast of its inverse (PlanInput::bcast_*: alpha + beta * bytes of the upper triangle, or of
// the d floats of a diagonal factor) is non-communicated (NCT): every replica inverts it; else
// (CT) the least loaded replica inverts it and a BCAST_INV_A/B unit on every replica broadcasts
// it. A split factor's blocks are placed as separate pieces (each its own size and costs): they
// are separate units in the gaps, and a block is what a replica inverts and sends. The broadcasts
// of cycle c's inverses run in cycle c+1 just before the stage's SYNC_CURV, one after the other
// in placement order (so every replica posts the stage's collectives in the same order), and every
// replica, owner included, switches to all inverses of cycle c (NCT and CT) right after that
// SYNC_CURV, so replicas stay identical. `placements` reports each stage's placement.
//
// Chimera (every stage held by two devices, the twins i and D-1-i, plus their replicas): the
// holders must sum their curvature and switch inverses at the same point, so a SYNC_CURV per
// stage is emitted even with W = 1, as with W > 1, but pinned: at the very end of cycle step K
// (after every other action of that step, before the optimizer), in stage order, on every device;
// K is the latest cycle step the twins need for their curvature (each with its best curvature
// packing). Blocking collectives there cannot deadlock: every rank has posted its sends of the
// step (syncs placed in gaps would sit at different points of the twins' lists and could). The
// inversions follow from cycle step K+1 on. A Chimera inversion that fits no gap runs right after
// the syncs, also pinned. Pinned units count as inline work (on the critical path: `inline_time`,
// `step_time`); a drawing does not show them.
// With `chimera_group` (the default) the twins (both hold stages i and D-1-i) and their replicas
// form each stage's group: Algorithm 1 places the stage's inversions over its 2W holders, the CT
// pieces' broadcasts are pinned before the sync, and every pair of twins has its own cycle length
// and K (pairs share nothing; a step-end sync waits only for the twin's step). Since the twins
// switch to cycle c's inverses only at cycle c+1's syncs, cycle c's inversions may also run in
// the next cycle's steps 0..K, in the gap time its curvature leaves (the gaps are shared: one
// cursor per gap); a pair takes the shortest R (and earliest K) for which both twins fit. Those
// units are "wrapped": listed in cycle steps 0..K from the second cycle on (`first_cycle`, which
// actions() hands out for the first R steps, omits them). Without the group every copy inverts
// all its stage's factors (W = 1) and all devices share one cycle and one K.
//
// Units larger than every gap (with margin): an inversion is split into k diagonal blocks (the
// block-diagonal factor of the paper's appendix A.2: block j of size n_j costs T * (n_j/d)^3;
// sizes as kfac's split_blocks), the smallest k whose largest block fits; if none does, or for
// curvature and sync, the unit runs inline: in cycle step 0 just before the stage's PREC (on
// the critical path; its dependencies are made inline too). `splits` and `inline_time` report it.
//
// Split when it shortens the refresh period (PlanInput::split_to_shorten, off by default): when a
// device (one pipeline, no inline work anywhere) needs more than one step, its whole inversions,
// largest first, are split into 2 diagonal blocks one more at a time (then 3, then 4) until it
// needs fewer steps; that first set is kept and reported in `splits` (its `strategy` says so),
// else nothing is split. A block-diagonal factor costs 1/k^2 of the inversion but approximates
// the factor (the trade the paper's appendix A.2 makes).
#include "kfac/placement.hpp"
#include "schedule/kfac_graph.hpp"
#include "schedule/schedule.hpp"
#include "sim/cost.hpp"
#include "sim/fit.hpp"
#include "sim/kfac_cost.hpp"
#include "sim/sim.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace pf {

// Where PREC goes in the step (PlanInput::precondition).
enum class PrecPlacement {
  gaps,  // in the first gap after the stage's gradients that holds it, else at the device's end
  end,   // at the device's end: it lengthens the step but leaves every gap to the other units
         // (the paper's accounting, T_pipe + T_prec with the whole T_bubble for curvature and inversion)
  best,  // both planned; kept: the fewer refresh steps (the longest, then their sum), then the shorter step
};

// What a run (its kfac.* and parallel.* settings) or `pipefisher plan --kfac` (its flags) asks
// of the planner besides the step and its costs.
struct PlanSettings {
  // The work placed: K-FAC's units, or SOAP's (optim.name = soap: each stage's eigenbasis
  // refreshes, EIG_L and EIG_R per rotated weight, packed as inversions are and never split; no
  // curvature, sync, broadcast or PREC: SOAP's rotations run in its OPT). SOAP's plans take one
  // pipeline (no Chimera); replicas refresh alike, each all of its stage's factors.
  BubbleWork work = BubbleWork::kfac;
  int replicas = 1;  // W data-parallel replicas per stage
  double margin = kFitMargin;
  // Split a device's largest inversions into diagonal blocks when that lowers its refresh steps
  // (see above). Off by default (exact factors, the paper's choice): only units larger than
  // every gap are split.
  bool split_to_shorten = false;
  // Chimera: a stage's holders (its two pipeline copies x W replicas) form one group that shares
  // the stage's inversions (Algorithm 1 over 2W members, inverses broadcast in the group), and
  // each pair of twins keeps its own cycle (see above). Off: every copy inverts all of its
  // stage's factors and all devices share one cycle (for comparison; the runtime runs the group).
  bool chimera_group = true;
  // Activation recomputation (parallel.recompute): a layer's inputs exist again only when the
  // backward re-runs the forward, so a micro-batch's CURV_A is ready after its backward, not its
  // forward (the measured backward durations include that forward).
  bool recompute = false;
  PrecPlacement precondition = PrecPlacement::best;
  // The shortest refresh cycle (kfac.min_refresh_steps): a device whose units fit in fewer steps
  // still refreshes every this many; its cycle's later steps run no curvature or inversion.
  int min_refresh_steps = 1;
};

struct PlanInput : PlanSettings {
  // One step, without K-FAC actions. Its optimizer steps (OPT) are set aside and end every list
  // of the plan, after the step's K-FAC units (a PREC must precede its stage's OPT).
  Schedule schedule;
  std::vector<std::vector<double>> durations;    // [device][index] measured (shape of schedule), or empty
  CostModel cost;                                // durations when `durations` is empty
  std::vector<StageKfacCost> kfac;               // [stage], or one entry for uniform stages
  // Broadcast of an inverse among the replicas (W > 1): bcast_alpha + bcast_beta * bytes, 4-byte
  // floats of the upper triangle (the comm performance model's fit; 0, 0: every piece is CT).
  double bcast_alpha = 0, bcast_beta = 0;
};

// The one builder of a PlanInput (the runtime's plans, `pipefisher plan --kfac`): the step, the
// settings, the broadcast model (alpha, beta), and each stage's measured K-FAC units as the
// planner takes them (planner_cost, times `scale`; none: the caller gives model costs). The
// step's durations (measured per action, or in.cost) are the caller's.
PlanInput plan_input(const Schedule& step, const PlanSettings& settings, std::pair<double, double> bcast,
                     const std::vector<StageKfacCost>& measured, double scale = 1);

// One placed K-FAC unit of one replica's device, times relative to its cycle step's start.
struct PlacedUnit {
  Action action;
  int replica = 0, device = 0;
  int step = 0;         // cycle step it runs in
  double start = 0, end = 0;
  bool inline_work = false;  // on the critical path (no gap could take it)
  bool wrapped = false;      // for the previous cycle: in cycle step 0's leading gap (Chimera group: up to step K)
  bool at_step_end = false;  // Chimera: pinned after everything of cycle step `step` (inline_work too)
};

// Zero-bubble W moved into earlier gaps of the step (place_weight_gradients).
struct WeightGradientMoves {
  int total = 0;           // W actions in the step (0: no split backward, nothing to move)
  int moved = 0;           // of them placed earlier than the schedule put them
  double step_before = 0;  // the step without K-FAC work, W where the schedule put them
  double step_after = 0;   // the same with the W moved (plain_step_time)
  // "zero-bubble W: 3 of 8 moved into earlier gaps, step 10.500 -> 10.000 without K-FAC work".
  std::string line() const;
};

struct FactorSplit {
  int pipeline = 0, stage = 0, layer = 0;
  Kind kind = Kind::INV_A;  // INV_A or INV_B
  int blocks = 1;
  double whole = 0;         // cost of the unsplit inversion
  double pieces = 0;        // total cost of the blocks
};

// Algorithm 1 over one stage's inversion pieces among its holders: pieces[k] is the INV_A/INV_B
// action (block -1 = whole factor) of placement index k; placement.owner[k] is a member index
// (members[m] = its device and replica; without Chimera's group member m is replica m), or
// kEveryRank: NCT.
struct StagePlacement {
  int pipeline = 0, stage = 0, device = 0;
  std::vector<std::pair<int, int>> members;  // [member] (device, replica)
  std::vector<Action> pieces;
  std::vector<int64_t> dims;
  std::vector<double> inv_time, bcast_time;  // [piece] as the placement used them
  InversionPlacement placement;
  int owner_of(const Action& inv_or_bcast) const;  // member, kEveryRank, or PF_CHECK failure
};

// A stage's precondition split by layer among its holders (the paper's section 2.3.2: data and
// inversion parallelism; the holders as StagePlacement's members), placed by SPD-KFAC's Algorithm 1
// over the layers, largest first: t_comp the layer's precondition (precondition_by_layer), t_comm
// its preconditioned gradient's part of the all-gather (bcast_beta * its bytes: weight, bias and
// v.g). A layer cheaper to precondition than to send is preconditioned by every holder (NCT), any
// other by the least loaded holder (CT). Each holder's PREC preconditions its layers and starts
// the all-gather of the CT layers' results (bcast_alpha + bcast_beta * the bytes it receives,
// counted in its PREC); the runtime completes it before the step's gradient norm. No split (every
// layer NCT) when the busiest holder's share with its gather would take as long as the whole.
struct PrecSplit {
  int pipeline = 0, stage = 0;
  std::vector<std::pair<int, int>> members;  // [member] (device, replica)
  InversionPlacement placement;              // [layer]: owner a member, or kEveryRank
  std::vector<double> layer_time;            // [layer] t_comp
  std::vector<double> time;                  // [member] its PREC: its layers and its gather
  bool split() const { return placement.communicated() > 0; }
  int member(int device, int replica) const;  // index in members, or PF_CHECK failure
};
// The split of (pipeline, stage) among `splits`, or null.
const PrecSplit* find_prec_split(const std::vector<PrecSplit>& splits, int pipeline, int stage);

// What the emit pass places and lists (KfacPlan keeps it private and answers queries on it):
// actions are [replica][device][cycle step] -> actions in order, the optimizer steps last.
struct PlanLists {
  std::vector<PlacedUnit> units;  // every K-FAC unit once per cycle (PREC excluded)
  // Steady state: wrapped units included.
  std::vector<std::vector<std::vector<std::vector<Action>>>> cycle;
  // The first cycle: no wrapped units.
  std::vector<std::vector<std::vector<std::vector<Action>>>> first_cycle;
  // The previous cycle's units in cycle[...] (list order), without the optimizer steps.
  std::vector<std::vector<std::vector<std::vector<Action>>>> wrapped_units;
  std::vector<FactorSplit> splits;          // the factors inverted as diagonal blocks
  std::vector<StagePlacement> placements;   // several holders: each hosted (pipeline, stage)'s placement
};

struct KfacPlan;
namespace plan {
struct PlanState;
KfacPlan assemble(PlanState&& state);  // the only writer of a KfacPlan (plan_state.hpp)
}  // namespace plan

struct KfacPlan {
  int devices = 0, replicas = 1;
  std::vector<int> refresh_steps;              // [device] cycle length R_d
  std::vector<int> lower_bound_refresh_steps;  // [device] ceil(work / bubble); -1 if no bubble
  std::vector<double> kfac_work;               // [device] curvature+sync+inversion per cycle (busiest replica)
  std::vector<double> bubble;                  // [device] gap time per step after PREC
  std::vector<double> device_inline;           // [device] inline work per cycle (busiest replica)
  std::vector<double> utilization_per_device;  // [device] busy / time over its cycle
  std::vector<std::string> strategy;           // [device] packing used (see planner.cpp)
  WeightGradientMoves weight_gradients;        // zero-bubble W moved before any K-FAC unit
  double plain_step_time = 0;                  // the step without any K-FAC work (not even PREC)
  double base_step_time = 0;                   // the step with PREC, no inline work
  std::vector<double> precondition;            // [device] its PREC time per step (the busiest replica)
  double step0_time = 0;                       // cycle step 0 with inline work
  double step_time = 0;                        // mean over the refresh period (PREC and inline included)
  double inline_time = 0;                      // step0_time - base_step_time: critical-path cost per cycle
  double utilization = 0;                      // mean over devices
  bool common_cycle = false;                   // all devices share one cycle (inline work present, or Chimera)
  int sync_step = -1;                          // Chimera: the latest sync_steps entry (-1: none)
  std::vector<int> sync_steps;                 // [device] Chimera: the cycle step whose end has its syncs
  std::vector<PrecSplit> prec_splits;          // several holders: each (pipeline, stage)'s precondition split
  Timeline base;                               // the step with PREC (what gaps were taken from)
  Timeline step0;                              // cycle step 0 with inline work (== base if none)
  Schedule step_template;                      // the input schedule (its header for schedule_for)

  // Every K-FAC unit once per cycle (PREC excluded), as placed.
  const std::vector<PlacedUnit>& units() const { return lists_.units; }
  // The factors inverted as diagonal blocks (split_blocks answers for one factor).
  const std::vector<FactorSplit>& splits() const { return lists_.splits; }
  // Several holders: each hosted (pipeline, stage)'s inversion placement (inverter() answers for one piece).
  const std::vector<StagePlacement>& placements() const { return lists_.placements; }
  int period() const;  // max refresh_steps: what a drawing of the whole refresh shows
  // What device `device` of replica `replica` runs in training step t (0-based).
  const std::vector<Action>& actions(int replica, int device, int64_t t) const;
  // The holder (device, replica) that inverts the piece an INV_A/B or BCAST_INV_A/B names and
  // broadcasts it to the stage's other holders; nullopt when every holder inverts it (NCT, or
  // the stage has one holder).
  std::optional<std::pair<int, int>> inverter(const Action& inv_or_bcast) const;
  // The precondition split of (pipeline, stage), or null (one holder: it preconditions every layer).
  const PrecSplit* prec_split(int pipeline, int stage) const;
  // The precondition's share of the step: how much PREC lengthens it (the step with PREC over the
  // step without K-FAC), over the mean step.
  double precondition_share() const;
  // One line on the precondition: its time on the busiest device, its share of the step, the splits.
  std::string precondition_line() const;
  // The previous cycle's units that cycle step k of device `device` runs (wrapped), in list order.
  std::vector<Action> wrapped(int replica, int device, int k) const;
  // The steady-state list of cycle step k (wrapped units included), the optimizer steps last.
  const std::vector<Action>& cycle_actions(int replica, int device, int k) const;
  // Cycles, in plan steps (t = the training step minus the plan's first): device d starts a
  // refresh cycle at every multiple of refresh_steps[d].
  bool is_cycle_start(int device, int64_t t) const;
  int64_t next_cycle_start(int device, int64_t t) const;  // the first cycle start at or after t
  // The first plan step at or after t by which every device has reached a cycle start (a drain
  // before re-planning ends there).
  int64_t all_cycles_start(int64_t t) const;
  // A step without K-FAC units but PREC (a drain: F/B, communication, PREC, optimizer steps).
  std::vector<Action> plain_actions(int replica, int device) const;
  // The diagonal blocks of the factor INV_A / INV_B (`inv`) of (pipeline, stage, layer) inverts
  // (`splits`): 1 when it is inverted whole.
  int split_blocks(int pipeline, int stage, int layer, Kind inv) const;
  // The whole step t of one replica as a Schedule (header of the input schedule).
  Schedule schedule_for(int replica, int64_t t) const;
  // Steady-state timeline of `steps` consecutive steps from a cycle start (step boundaries at
  // step_starts), K-FAC units included; for drawing and tracing.
  Timeline period_timeline(int replica, int steps, std::vector<double>* step_starts) const;

 private:
  // The lists have one writer: the emit pass builds them whole and assemble stores them once.
  friend KfacPlan plan::assemble(plan::PlanState&& state);
  PlanLists lists_;
};

// A step with inline K-FAC, before any plan (PipeFisher's profiling steps; kfac.placement inline
// and skip always): device `device`'s list of `step` with a PREC for each stage it hosts, in
// stage order, just before its first OPT (at the end without one). step_index[i] is the index in
// step.per_device[device] of actions[i], -1 for an added PREC.
struct InlineStep {
  std::vector<Action> actions;
  std::vector<int> step_index;
};
InlineStep profiling_actions(const Schedule& step, int device);

// Throws UsageError (naming the flag) for inconsistent input, e.g. a schedule that already has
// K-FAC actions or a cost table whose stage count does not match.
KfacPlan plan_kfac(const PlanInput& in);

}  // namespace pf
