#pragma once
// The one fit rule and its margin: work of `duration` fits the room from `start` to `end` when
//   start + duration * (1 + margin) <= end
// The planner asks it of the step's gaps (ms; with a tolerance for the rounding of its sums,
// plan/plan_state.hpp: gap_fit), adaptive's filler of the waits it measures (ns,
// runtime/bubble_filler.cpp).
namespace pf {

// The paper's 5% (20% measured no better on this shared 2-core machine: bench/RESULTS.md).
inline constexpr double kFitMargin = 0.05;

struct Fit {
  double margin = kFitMargin;
  double tolerance = 0;
  double padded(double duration) const { return duration * (1 + margin); }
  bool holds(double start, double duration, double end) const { return start + padded(duration) <= end + tolerance; }
};

}  // namespace pf
