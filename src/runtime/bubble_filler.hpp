#pragma once
// kfac.placement = adaptive: PipeFisher's plan, with its curvature and inversion units placed at
// run time into the waits where each rank actually idles (issue "bubbles that adapt at run time").
//
// The plan (plan/planner.hpp) still says which units run in which step, so the refresh pattern,
// and with it every bit of training, is the static plan's (`bubbles`). Within a step a unit
// *floats*: it is queued at its planned place instead of run, and runs
//   - in a wait: a RECV whose message has not arrived, or an ALLREDUCE whose buckets are still
//     being summed, when it is predicted to finish before the data comes (each unit's and each
//     wait's running profile, updated every step); arrival is tested between units, so a wait
//     ends when its data comes, not when a unit does (MPI advances a collective only inside MPI
//     calls: a unit in an all-reduce's wait can hold the copies' sum until it ends);
//   - in its best wait: a unit due before a pass (which its deadline would delay by the whole
//     unit) that fits no wait starts in one with no later wait of its window predicted to have
//     more room, delaying that pass only by its overrun (units that fit come first; a unit due
//     at the OPT or the step's end keeps its deadline, which may lie in the shadow of another
//     rank's tail);
//   - at its deadline otherwise: before the next action that needs its result (the "cheapest
//     place" the step still offers).
// The units form a dependency-ordered ready queue: each runs within its window, and the units of
// one layer (of one chunk) in the plan's order, as the K-FAC graph says (schedule/kfac_graph.hpp:
// kfac_windows); units of different layers share no state, so a unit that fits a wait may pass
// one that does not. Collectives (SYNC_CURV, BCAST_INV) and PREC stay where the plan put them:
// copies switch inverses at the same step whatever order each one's filler chose, and no rank
// blocks in a collective that its copy reaches only after a message from it. A unit fits a wait
// by the planner's rule and margin (sim/fit.hpp).
//
// With no prediction yet (a wait or unit not seen before) a wait runs only the units planned
// before it, as `bubbles` would. Timing decides only *when* a unit runs, never what it computes.
#include "schedule/action.hpp"
#include "schedule/kfac_graph.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

namespace pf {

// How the filler's units ran over the run (this rank's counts).
struct FillerStats {
  int64_t in_wait = 0;      // units that ran inside a wait
  int64_t at_deadline = 0;  // units that found no room and ran where their window closes
  int64_t waits_filled = 0; // waits in which at least one unit ran
};

// A unit handed to a wait: predicted to end before the data comes (fits), or started in its
// best wait though it will not.
struct WaitPick {
  size_t unit = 0;  // its action index
  bool fits = true;
};

class BubbleFiller {
 public:
  // The actions whose waits units may fill: a receive, a gradient all-reduce.
  static bool is_wait(Kind k) { return k == Kind::RECV_F || k == Kind::RECV_B || k == Kind::ALLREDUCE; }
  // Step start: the step's floating units and their windows (kfac_windows).
  void begin(const std::vector<Action>& list);
  bool floats(size_t i) const { return floating_.at(i) >= 0; }
  size_t units() const { return windows_.size(); }
  // A unit that must run before action i (i = the list's size: the step's end), if any is left:
  // the first in queue order whose window closes there or earlier.
  std::optional<size_t> next_due(size_t i) const;

  // In the wait of action i, `waited_ns` into it: a unit to run there, if one is ready and fits
  // (the first in queue order), else one for which no later wait is better.
  std::optional<WaitPick> next_for_wait(size_t i, int64_t waited_ns) const;
  // Unit (action index) u ran, taking `ns`; in_wait says where (a wait, or its deadline).
  void ran(size_t u, int64_t ns, bool in_wait);
  // The wait of action i ended: its data came `ns` after the wait began (exactly, when it was
  // waited for; else a lower bound: the start of the unit during which it came). filled: units
  // ran; overran: the data came during a unit that was not predicted to fit.
  void waited(size_t i, int64_t ns, bool filled, bool overran = false);

  const FillerStats& stats() const { return stats_; }

 private:
  using WaitKey = std::tuple<int, int, int, int>;  // kind, pipeline, stage, micro-batch
  static WaitKey wait_key(const Action& a);
  bool ready(size_t q, size_t i) const;  // unit q may run at action i: window open, its layer's earlier units run
  bool room_later(size_t q, size_t i, double room_ns) const;  // a wait after i in q's window has more room
  bool due_at_pass(size_t q) const;                           // q's deadline is a pass (F, B, I, W)

  // The step.
  const std::vector<Action>* list_ = nullptr;
  std::vector<int> floating_;        // [action] its place in the queue, -1 if it does not float
  std::vector<KfacWindow> windows_;  // the queue: each floating unit's window, in plan order
  std::vector<bool> ran_;            // [queue]
  std::vector<size_t> waits_;        // the step's waits (is_wait), in order
  size_t open_ = 0;                  // the queue's [0, open_) have all run
  // The running profile (ns), over the run: exponential averages.
  std::map<KfacCostKey, double> unit_ns_;
  std::map<WaitKey, double> wait_ns_;
  FillerStats stats_;
};

}  // namespace pf
