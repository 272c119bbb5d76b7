#pragma once
// How the executor runs a step's list (Executor::run), as the placement says (KfacPlacement::driver):
//   InOrder       each action in the list's order (no K-FAC, inline, skip, bubbles)
//   FillingWaits  kfac.placement = adaptive: the list's curvature and inversion units float; each
//                 runs inside a receive's or gradient all-reduce's wait it is predicted to fit, or
//                 where its window closes (runtime/bubble_filler.hpp). Timing decides only when a
//                 unit runs, never what it computes.
// A driver asks the executor for actions through StepActions; the executor knows no driver's kind.
#include "runtime/bubble_filler.hpp"
#include "schedule/action.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pf {

// What a driver may ask of the executor during one step.
class StepActions {
 public:
  virtual ~StepActions() = default;
  // Action i through the dispatch table, stamped; its ns.
  virtual int64_t run(size_t i) = 0;
  // Has what wait i (BubbleFiller::is_wait) waits for come? A test: nothing blocks.
  virtual bool arrived(size_t i) = 0;
  // Receive i was completed by the test: stamped as a wait of no time, instead of run.
  virtual void received(size_t i) = 0;
  // Unit u ran inside wait i (its stamp says so, for the profiler).
  virtual void ran_in_wait(size_t u, size_t i) = 0;
};

class StepDriver {
 public:
  virtual ~StepDriver() = default;
  // Every action stamped even when no one asked for the step's times (the filler learns from them).
  virtual bool stamps_all() const { return false; }
  // Runs `list`, every action once, through `step`.
  virtual void run(const std::vector<Action>& list, StepActions& step) = 0;
  // Collective at the run's end: what the driver did, summed over the ranks (rank 0 prints).
  virtual void print_summary(bool root) const {}
};

class InOrder final : public StepDriver {
 public:
  void run(const std::vector<Action>& list, StepActions& step) override;
};

class FillingWaits final : public StepDriver {
 public:
  bool stamps_all() const override { return true; }
  void run(const std::vector<Action>& list, StepActions& step) override;
  void print_summary(bool root) const override;

 private:
  void run_due(StepActions& step, size_t i);                  // the units due before action i
  void fill_wait(const std::vector<Action>& list, StepActions& step, size_t i);  // wait i filled with units that fit
  BubbleFiller filler_;
};

}  // namespace pf
