#pragma once
// kfac.placement = adaptive: PipeFisher's plan, with its curvature and inversion units placed at
// run time into the waits where each rank actually idles (issue "bubbles that adapt at run time").
//
// The plan (plan/planner.hpp) still says which units run in which step, so the refresh pattern,
// and with it every bit of training, is the static plan's (`bubbles`). Within a step a unit
// *floats*: it is queued at its planned place instead of run, and runs
//   - in a wait: a RECV whose message has not arrived, when it is predicted to finish before the
//     message does (each unit's and each wait's running profile, updated every step); arrival is
//     tested between units, so a wait ends when its message comes, not when a unit does;
//   - at its deadline otherwise: before the next action that needs its result (the "cheapest
//     place" the step still offers).
// Units run in the plan's order (one queue per step), so factors sum in the same order; a unit
// never runs before the actions it reads from nor after those that read it (its window):
//   CURV_A / CURV_B  between its chunk's passes (F, B, I, W: the saved inputs and gradients)
//   INV_A / INV_B    between its chunk's SYNC_CURV, BCAST_INV and PREC
//   both             before any OPT (the first OPT preconditions every chunk) and the step's end
// Collectives (SYNC_CURV, BCAST_INV) and PREC stay where the plan put them: copies switch inverses
// at the same step whatever order each one's filler chose, and no rank blocks in a collective
// that its copy reaches only after a message from it.
//
// With no prediction yet (a wait or unit not seen before) a wait runs only the units planned
// before it, as `bubbles` would. Timing decides only *when* a unit runs, never what it computes.
#include "schedule/action.hpp"

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

class BubbleFiller {
 public:
  // Step start: the step's floating units, their windows and the deadlines.
  void begin(const std::vector<Action>& list);
  bool floats(size_t i) const { return floating_.at(i) >= 0; }
  // Units (in queue order) that must have run before action i runs; units() at the step's end.
  size_t due_before(size_t i) const { return due_.at(i); }
  size_t units() const { return queue_.size(); }
  size_t done() const { return done_; }
  size_t head() const { return queue_.at(done_); }  // the next unit's action index

  // In the wait of action i, `waited_ns` into it: the next unit to run there, if any fits.
  std::optional<size_t> next_for_wait(size_t i, int64_t waited_ns) const;
  // The head unit ran, taking `ns`; in_wait says where (a wait, or its deadline).
  void ran(int64_t ns, bool in_wait);
  // The wait of action i ended: its message came `ns` after the wait began (exactly, when it was
  // waited for; else a lower bound: the start of the unit during which it came). filled: units ran.
  void waited(size_t i, int64_t ns, bool filled);

  const FillerStats& stats() const { return stats_; }

 private:
  using Key = std::tuple<int, int, int, int, int>;  // kind, pipeline, stage, layer or micro-batch, block
  static Key unit_key(const Action& a);
  static Key wait_key(const Action& a);
  void set_windows(const std::vector<Action>& list);
  std::optional<double> predicted(const std::map<Key, double>& m, const Key& k) const;

  // The step.
  const std::vector<Action>* list_ = nullptr;
  std::vector<int> floating_;     // [action] its place in queue_, -1 if it does not float
  std::vector<size_t> queue_;     // floating units' action indices, in plan order
  std::vector<size_t> earliest_;  // [queue] the first action index it may run at
  std::vector<size_t> due_;       // [action] queue_ prefix that must have run before it
  size_t done_ = 0;
  // The running profile (ns), over the run: exponential averages.
  std::map<Key, double> unit_ns_, wait_ns_;
  FillerStats stats_;
};

}  // namespace pf
