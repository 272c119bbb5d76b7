#pragma once
// The K-FAC work of a step as one graph, its rules written here once (zero-bubble's scheduler
// keeps one node graph that its passes, its simulator and its runtime all read):
//   - the planner places the units kfac_graph emits for each device (plan/plan_units.cpp);
//   - the simulator times any schedule with the units' reads as their waits (deps.cpp);
//   - `bubbles` runs the planned lists in order; `adaptive` moves each floating unit within its
//     window (kfac_windows) into the waits it measures (runtime/bubble_filler.cpp).
//
// What a unit reads (its predecessors; those the schedule has):
//   CURV_A(p,s,m,l)    F(p,s,m); with recomputation the backward, B or I(p,s,m) (a layer's
//                      inputs exist again only when the backward re-runs the forward)
//   CURV_B(p,s,m,l)    the input-gradient backward, B or I(p,s,m) (the output gradient exists at
//                      I: W need not run first)
//   SYNC_CURV(p,s)     every CURV_A and CURV_B of (p,s)
//   INV_A/B(p,s,l)     every CURV_A/B of (p,s,l), then SYNC_CURV(p,s) (whole, or each diagonal block)
//   BCAST_INV_A/B      nothing of this step: it sends the previous refresh cycle's inverse (the
//                      planner chains a stage's broadcasts just before its SYNC_CURV, in one
//                      order on every holder)
//   PREC(p,s)          every final backward (B or W) of (p,s), then ALLREDUCE(p,s)
//   EIG_L/R(p,s,l)     SOAP's (BubbleWork::soap, which has no K-FAC unit): nothing of this step.
//                      The refresh reads the statistic and basis the previous step's update left
//                      and changes the basis and the moments the step's own update reads, so it
//                      runs anywhere before its chunk's OPT (optim/optimizer.hpp, Soap)
//   STAT(p,s,l)        SOAP's statistics: no unit of the graph. Like PREC it is part of every step
//                      (the planner puts it into the base step, plan_prec.cpp); it adds the previous
//                      step's gradients, and a refresh that runs first adds its side itself
//
// Where a placed unit may run (its window): between the nearest actions around its place in its
// device's list that it may not pass (bounds_window):
//   every unit         an OPT (the first OPT preconditions every chunk); its chunk's SYNC_CURV,
//                      BCAST_INV_* and PREC: collectives and the precondition stay where the plan
//                      put them, so copies switch inverses at the same step whatever order each
//                      one ran its units in
//   CURV_A / CURV_B    also its chunk's passes (F, B, I, W: the saved inputs and gradients)
// Only curvature and inversion move (floats). The units of one layer (of one chunk) keep the
// plan's order: each factor sums in one order and an inversion reads the factors the plan's did
// (its damping reads both of its layer's), so a unit's window closes no later than the next one's
// of its layer.
//
// A unit's cost key is all of it but the micro-batch: a curvature unit costs the same for every
// micro-batch.
#include "schedule/action.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pf {

struct KfacRules {
  bool recompute = false;  // parallel.recompute: CURV_A reads the backward
};

// One row of what a unit reads: the actions of `kinds` in the unit's chunk (pipeline, stage)
// that match it on `match`: every one (in list order), or the first of the kinds the schedule has.
enum class Match { micro_batch, layer, chunk };
struct KfacRead {
  std::array<Kind, 2> kinds;
  int count = 1;  // kinds[0, count)
  Match match = Match::chunk;
  bool every = false;
  bool reads(Kind k) const { return k == kinds[0] || (count > 1 && k == kinds[1]); }
};
// The rows of `unit`'s kind, in order (the table above); none for the pipeline's own kinds.
std::span<const KfacRead> kfac_reads(Kind unit, const KfacRules& rules = {});
// A chunk's final backwards (B, or W after I): PREC's row, and what the gradient all-reduce and
// the optimizer step wait for (deps.cpp).
inline constexpr KfacRead kFinalBackwards{{Kind::B, Kind::W}, 2, Match::chunk, true};

// Actions indexed by what the rows match them on, each known by its number (the order they were
// added in): deps.cpp over a schedule, kfac_graph over its units.
class KfacIndex {
 public:
  void reserve(size_t actions);
  int add(const Action& a);  // its number
  // The first added action (kind, pipeline, stage, micro-batch, layer), or -1.
  int find(Kind k, int pipeline, int stage, int micro_batch = -1, int layer = -1) const;
  // Appends every added action of the row's kinds of (pipeline, stage) (of `layer` when >= 0), in
  // order (rows that read every one: curvature and final backwards).
  void every(const KfacRead& row, int pipeline, int stage, int layer, std::vector<int>& out) const;
  // Appends what `unit` reads (kfac_reads), row by row.
  void reads(const Action& unit, const KfacRules& rules, std::vector<int>& out) const;

 private:
  int count_ = 0;
  std::unordered_map<uint64_t, int> at_;  // a duplicate keeps the first (the validator reports it)
  std::map<std::tuple<int, int, int, int>, std::vector<int>> of_;  // (kind, pipeline, stage, layer or -1: all)
};

// A unit's measured cost is keyed by all of it but the micro-batch.
struct KfacCostKey {
  Kind kind = Kind::CURV_A;
  int pipeline = 0, stage = 0, layer = -1, block = -1;
  friend auto operator<=>(const KfacCostKey&, const KfacCostKey&) = default;
};
KfacCostKey cost_key(const Action& unit);

// One device's K-FAC units of a step, before placement (the planner's input).
struct KfacNode {
  Action action;           // an inversion whole (block -1): the planner may split it
  int pass = -1;           // curvature: the index in the step's list of the pass it reads
  std::vector<int> reads;  // the earlier nodes it reads, row by row
  KfacCostKey cost;
};
// The work a graph holds: K-FAC's units, or SOAP's (optim.name = soap).
enum class BubbleWork { kfac, soap };
struct KfacGraphInput {
  BubbleWork work = BubbleWork::kfac;
  KfacRules rules;
  bool sync = false;        // a SYNC_CURV per chunk: several holders (replicas, Chimera's twins)
  std::vector<int> layers;  // [stage] its K-FAC layers (SOAP: its rotated weights)
};
struct KfacGraph {
  std::vector<std::pair<int, int>> chunks;  // hosted (pipeline, stage), by first forward
  // In the planner's priority classes: CURV_A, then CURV_B (each pass's layers, in list order),
  // SYNC_CURV (chunk by chunk), INV_A, then INV_B (chunk by chunk, layer by layer). SOAP's:
  // EIG_L, then EIG_R (chunk by chunk, layer by layer).
  std::vector<KfacNode> nodes;
};
// `step`: one device's list of a step without K-FAC units (PREC may be in it).
KfacGraph kfac_graph(const std::vector<Action>& step, const KfacGraphInput& in);

// A placed unit's window in its device's list.
struct KfacWindow {
  size_t at = 0;        // its place in the list
  size_t earliest = 0;  // the first index it may run at
  size_t latest = 0;    // the action it must run before (the list's size: the step's end)
  int before = -1;      // the window of its layer's previous unit (an index of the result), -1: none
};
bool floats(Kind k);  // CURV_A / CURV_B / INV_A / INV_B
// May `unit` not pass action `a` of its device's list (the table above)?
bool bounds_window(const Action& a, const Action& unit);
// The window of every floating unit of `list`, in list order.
std::vector<KfacWindow> kfac_windows(const std::vector<Action>& list);

}  // namespace pf
